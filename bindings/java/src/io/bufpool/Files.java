package io.bufpool;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.CopyOption;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.LinkOption;
import java.nio.file.OpenOption;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.Set;

/**
 * File copies over {@link FileChannel}, beside
 * {@link java.nio.file.Files#copy(Path, Path, CopyOption...)}: through
 * pooled direct buffers (a read/write loop whose memory is bounded by the
 * pool) or with {@link FileChannel#transferTo} (the kernel copies).
 *
 * <p>Like {@code java.nio.file.Files.copy}: the target must not exist unless
 * {@link StandardCopyOption#REPLACE_EXISTING} is given (then it is truncated
 * and written in place); copying a file onto itself does nothing; attributes
 * are not copied. Other options throw {@code UnsupportedOperationException}.
 *
 * <p>Thread safety: any number of copies may run at once; they share the
 * pool they are given (or the default pool) and wait for its buffers.
 */
public final class Files {
  private Files() {}

  /** How the bytes move. */
  public enum Method {
    /**
     * Scattering reads into a batch of pooled buffers, gathering writes
     * out of them ({@code readv}/{@code writev}).
     */
    READ_WRITE,
    /** {@link FileChannel#transferTo}: the kernel copies (copy_file_range). */
    TRANSFER_TO
  }

  /** Buffers one READ_WRITE round moves at most. */
  static final int BATCH = 16;

  private static final class DefaultPool {
    // 64 buffers of 64 KiB (4 MiB), for the life of the process: every
    // copy without a pool of its own draws from it.
    static final BufferPool POOL = BufferPool.create(BufferPool.options()
        .bufferSize(64 * 1024).bufferCount(64).name("io.bufpool.Files")
        .leakDetection(BufferPool.LeakDetection.OFF));
  }

  /** The pool that copies without one of their own use (4 MiB). */
  public static BufferPool defaultPool() {
    return DefaultPool.POOL;
  }

  /** Copies source to target with the default pool; returns the bytes copied. */
  public static long copy(Path source, Path target, Method method, CopyOption... options)
      throws IOException {
    return copy(method == Method.READ_WRITE ? defaultPool() : null, source, target, method,
        options);
  }

  /**
   * Copies source to target; READ_WRITE draws its buffers from {@code pool}
   * (up to 16 at a time, waiting when none is free), TRANSFER_TO needs
   * none ({@code pool} may be null). Returns the bytes copied.
   */
  public static long copy(BufferPool pool, Path source, Path target, Method method,
                          CopyOption... options) throws IOException {
    boolean replace = false;
    for (CopyOption o : options) {
      if (o == StandardCopyOption.REPLACE_EXISTING) {
        replace = true;
      } else {
        throw new UnsupportedOperationException("io.bufpool.Files.copy: option " + o
            + " is not supported (only REPLACE_EXISTING)");
      }
    }
    if (method == Method.READ_WRITE && pool == null) {
      throw new IllegalArgumentException("io.bufpool.Files.copy: READ_WRITE needs a pool");
    }
    if (java.nio.file.Files.exists(target, LinkOption.NOFOLLOW_LINKS)) {
      if (java.nio.file.Files.isSameFile(source, target)) {
        return 0;
      }
      if (!replace) {
        throw new FileAlreadyExistsException(target.toString());
      }
    }
    Set<OpenOption> out = replace
        ? Set.of(StandardOpenOption.WRITE, StandardOpenOption.CREATE,
            StandardOpenOption.TRUNCATE_EXISTING)
        : Set.of(StandardOpenOption.WRITE, StandardOpenOption.CREATE_NEW);
    try (FileChannel in = FileChannel.open(source, StandardOpenOption.READ);
         FileChannel dst = FileChannel.open(target, out)) {
      return method == Method.TRANSFER_TO ? transfer(in, dst) : readWrite(pool, in, dst);
    }
  }

  private static long transfer(FileChannel in, FileChannel out) throws IOException {
    long size = in.size();
    long done = 0;
    while (true) {
      // Past the size seen at the start too: a file that grows is copied
      // to its end, as a read loop would.
      long n = in.transferTo(done, Math.max(size - done, 1L << 30), out);
      if (n <= 0) {
        break;
      }
      done += n;
    }
    return done;
  }

  private static long readWrite(BufferPool pool, FileChannel in, FileChannel out)
      throws IOException {
    PooledBuffer[] held = take(pool);
    try {
      ByteBuffer[] views = new ByteBuffer[held.length];
      for (int i = 0; i < held.length; i++) {
        views[i] = held[i].byteBuffer();
      }
      long total = 0;
      while (true) {
        for (ByteBuffer v : views) {
          v.clear();
        }
        long got = 0;
        // Fill the batch (short reads happen) or stop at the end.
        while (views[views.length - 1].hasRemaining()) {
          long n = in.read(views);
          if (n < 0) {
            break;
          }
          got += n;
        }
        if (got == 0) {
          return total;
        }
        for (ByteBuffer v : views) {
          v.flip();
        }
        long left = got;
        while (left > 0) {
          left -= out.write(views);
        }
        total += got;
        if (views[views.length - 1].limit() < views[views.length - 1].capacity()) {
          return total;  // the last read ended at the end of the file
        }
      }
    } finally {
      pool.releaseAll(held);
    }
  }

  /** Up to BATCH buffers at once, at least one (waiting for it). */
  private static PooledBuffer[] take(BufferPool pool) {
    for (int n = BATCH; n > 1; n /= 2) {
      PooledBuffer[] got = pool.acquireBulk(n);
      if (got != null) {
        return got;
      }
    }
    return new PooledBuffer[] {pool.acquire()};
  }
}
