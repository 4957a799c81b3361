// The seed's I/O experiments in Java, through the binding and beside the
// JDK's own ways, interleaved: every round runs every contender once, in
// an order rotated each round. Prints one JSON line per contender per round.
//
//   java --enable-native-access=ALL-UNNAMED -cp bufpool.jar:. IoBench copy DIR [MiB] [rounds]
//   java --enable-native-access=ALL-UNNAMED -cp bufpool.jar:. IoBench records DIR [records] [rounds]
//
// copy: a file of MiB (default 512) in DIR, read once so it is in the page
// cache, copied by (each copy's target removed and `sync` run before it,
// untimed, so one copy's writeback does not slow the next):
//   java_stream_copy          FileInputStream/FileOutputStream, 8 KiB byte[]
//   java_channel_direct_copy  FileChannel read/write through one 1 MiB
//                             allocateDirect buffer
//   java_transferTo           FileChannel.transferTo
//   java_files_copy           java.nio.file.Files.copy
//   java_bufpool_copy_read_write   io.bufpool.Files.copy(READ_WRITE): 16
//                             pooled 64 KiB buffers per readv/writev
//   java_bufpool_copy_transfer_to  io.bufpool.Files.copy(TRANSFER_TO)
// {"workload": "copy", "contender", "round", "seconds", "mib_s"}
//
// records: N records (default 1,000,000) of an int, a long and a 6-byte
// string, written field by field to a file in DIR and read back field by
// field, every value checked, with:
//   java_records_data_stream     DataOutputStream(BufferedOutputStream(FileOutputStream))
//                                and DataInputStream(BufferedInputStream(FileInputStream))
//   java_records_channel_direct  FileChannel with one allocateDirect(4096) buffer
//   java_records_channel_pooled  FileChannel with one pooled 4 KiB buffer (the binding)
// {"workload": "records", "contender", "round", "seconds", "mrecords_s"}
import io.bufpool.BufferPool;
import io.bufpool.PooledBuffer;
import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;

public final class IoBench {
  interface Job {
    void run() throws IOException;
  }

  record Contender(String name, Job job) {}

  public static void main(String[] args) throws Exception {
    if (args.length < 2 || !(args[0].equals("copy") || args[0].equals("records"))) {
      System.err.println("usage: IoBench copy|records DIR [MiB|records] [rounds]");
      System.exit(2);
    }
    Path dir = Path.of(args[1]);
    int rounds = args.length > 3 ? Integer.parseInt(args[3]) : 5;
    if (args[0].equals("copy")) {
      copy(dir, args.length > 2 ? Integer.parseInt(args[2]) : 512, rounds);
    } else {
      records(dir, args.length > 2 ? Integer.parseInt(args[2]) : 1_000_000, rounds);
    }
  }

  // ---- copy --------------------------------------------------------------------

  static void copy(Path dir, int mib, int rounds) throws Exception {
    Path src = dir.resolve("iobench-src");
    Path dst = dir.resolve("iobench-dst");
    try {
      byte[] chunk = new byte[1 << 20];
      new Random(42).nextBytes(chunk);
      try (OutputStream out = Files.newOutputStream(src)) {
        for (int i = 0; i < mib; i++) {
          out.write(chunk);
        }
      }
      long size = Files.size(src);
      List<Contender> cs = new ArrayList<>();
      cs.add(new Contender("java_stream_copy", () -> streamCopy(src, dst)));
      cs.add(new Contender("java_channel_direct_copy", () -> channelCopy(src, dst)));
      cs.add(new Contender("java_transferTo", () -> transferTo(src, dst)));
      cs.add(new Contender("java_files_copy", () -> Files.copy(src, dst)));
      cs.add(new Contender("java_bufpool_copy_read_write",
          () -> io.bufpool.Files.copy(src, dst, io.bufpool.Files.Method.READ_WRITE)));
      cs.add(new Contender("java_bufpool_copy_transfer_to",
          () -> io.bufpool.Files.copy(src, dst, io.bufpool.Files.Method.TRANSFER_TO)));
      readAll(src);  // into the page cache
      for (Contender c : cs) {  // warm-up
        Files.deleteIfExists(dst);
        c.job.run();
      }
      for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < cs.size(); i++) {
          Contender c = cs.get((i + r) % cs.size());
          Files.deleteIfExists(dst);
          sync();
          long t0 = System.nanoTime();
          c.job.run();
          double s = (System.nanoTime() - t0) / 1e9;
          if (Files.size(dst) != size) {
            throw new IOException(c.name + " copied " + Files.size(dst) + " of " + size + " bytes");
          }
          System.out.printf("{\"workload\": \"copy\", \"contender\": \"%s\", \"round\": %d, "
              + "\"seconds\": %.5f, \"mib_s\": %.1f, \"mib\": %d}%n", c.name, r + 1, s, mib / s, mib);
        }
      }
    } finally {
      Files.deleteIfExists(src);
      Files.deleteIfExists(dst);
    }
  }

  static void sync() throws IOException, InterruptedException {
    new ProcessBuilder("sync").inheritIO().start().waitFor();
  }

  static void readAll(Path p) throws IOException {
    try (InputStream in = Files.newInputStream(p)) {
      byte[] b = new byte[1 << 20];
      while (in.read(b) > 0) {
        // the page cache is the point
      }
    }
  }

  static void streamCopy(Path src, Path dst) throws IOException {
    try (FileInputStream in = new FileInputStream(src.toFile());
         FileOutputStream out = new FileOutputStream(dst.toFile())) {
      byte[] b = new byte[8192];
      int n;
      while ((n = in.read(b)) > 0) {
        out.write(b, 0, n);
      }
    }
  }

  static void channelCopy(Path src, Path dst) throws IOException {
    try (FileChannel in = FileChannel.open(src, StandardOpenOption.READ);
         FileChannel out = FileChannel.open(dst, StandardOpenOption.WRITE,
             StandardOpenOption.CREATE_NEW)) {
      ByteBuffer b = ByteBuffer.allocateDirect(1 << 20);
      while (in.read(b) > 0) {
        b.flip();
        while (b.hasRemaining()) {
          out.write(b);
        }
        b.clear();
      }
    }
  }

  static void transferTo(Path src, Path dst) throws IOException {
    try (FileChannel in = FileChannel.open(src, StandardOpenOption.READ);
         FileChannel out = FileChannel.open(dst, StandardOpenOption.WRITE,
             StandardOpenOption.CREATE_NEW)) {
      long size = in.size();
      long done = 0;
      while (done < size) {
        done += in.transferTo(done, size - done, out);
      }
    }
  }

  // ---- records -------------------------------------------------------------------

  static final byte[] NAME = "record".getBytes(StandardCharsets.US_ASCII);
  static final int RECORD = 4 + 8 + 6;

  static void records(Path dir, int n, int rounds) throws Exception {
    Path file = dir.resolve("iobench-records");
    try (BufferPool pool = BufferPool.create(BufferPool.options().bufferSize(4096).bufferCount(16))) {
      List<Contender> cs = new ArrayList<>();
      cs.add(new Contender("java_records_data_stream", () -> dataStream(file, n)));
      cs.add(new Contender("java_records_channel_direct",
          () -> channel(file, n, ByteBuffer.allocateDirect(4096))));
      cs.add(new Contender("java_records_channel_pooled", () -> {
        try (PooledBuffer b = pool.acquire()) {
          channel(file, n, b.byteBuffer());
        }
      }));
      for (Contender c : cs) {
        c.job.run();
      }
      for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < cs.size(); i++) {
          Contender c = cs.get((i + r) % cs.size());
          long t0 = System.nanoTime();
          c.job.run();
          double s = (System.nanoTime() - t0) / 1e9;
          System.out.printf("{\"workload\": \"records\", \"contender\": \"%s\", \"round\": %d, "
              + "\"seconds\": %.5f, \"mrecords_s\": %.2f, \"records\": %d}%n",
              c.name, r + 1, s, n / s / 1e6, n);
        }
      }
    } finally {
      Files.deleteIfExists(file);
    }
  }

  static void check(boolean ok, int i) throws IOException {
    if (!ok) {
      throw new IOException("record " + i + " read back wrong");
    }
  }

  static void dataStream(Path file, int n) throws IOException {
    try (DataOutputStream out = new DataOutputStream(new BufferedOutputStream(
        new FileOutputStream(file.toFile())))) {
      for (int i = 0; i < n; i++) {
        out.writeInt(i);
        out.writeLong(i * 3L);
        out.write(NAME);
      }
    }
    byte[] name = new byte[6];
    try (DataInputStream in = new DataInputStream(new BufferedInputStream(
        new FileInputStream(file.toFile())))) {
      for (int i = 0; i < n; i++) {
        check(in.readInt() == i, i);
        check(in.readLong() == i * 3L, i);
        in.readFully(name);
        check(name[5] == 'd', i);
      }
    }
  }

  static void channel(Path file, int n, ByteBuffer b) throws IOException {
    try (FileChannel out = FileChannel.open(file, StandardOpenOption.WRITE,
        StandardOpenOption.CREATE, StandardOpenOption.TRUNCATE_EXISTING)) {
      b.clear();
      for (int i = 0; i < n; i++) {
        if (b.remaining() < RECORD) {
          drain(out, b);
        }
        b.putInt(i);
        b.putLong(i * 3L);
        b.put(NAME);
      }
      drain(out, b);
    }
    byte[] name = new byte[6];
    try (FileChannel in = FileChannel.open(file, StandardOpenOption.READ)) {
      b.clear().flip();
      for (int i = 0; i < n; i++) {
        if (b.remaining() < RECORD) {
          b.compact();
          while (b.position() < RECORD) {
            if (in.read(b) < 0) {
              throw new IOException("short file at record " + i);
            }
          }
          b.flip();
        }
        check(b.getInt() == i, i);
        check(b.getLong() == i * 3L, i);
        b.get(name);
        check(name[5] == 'd', i);
      }
    }
  }

  static void drain(FileChannel out, ByteBuffer b) throws IOException {
    b.flip();
    while (b.hasRemaining()) {
      out.write(b);
    }
    b.clear();
  }
}
