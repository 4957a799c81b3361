package io.bufpool;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.util.concurrent.atomic.AtomicIntegerFieldUpdater;

/**
 * One buffer of a {@link BufferPool}, held from its acquire until its
 * {@link #close()} (or {@link #release()}, the same call). The buffer is a
 * slice of the pool's region: {@code bufferSize} bytes, aligned to the
 * page and to its size.
 *
 * <p><b>Exactly once.</b> The first release gives the buffer back; later
 * ones, from any thread, do nothing. After it, every accessor throws
 * {@code IllegalStateException} naming the buffer.
 *
 * <p><b>The hazard.</b> A {@code ByteBuffer} or {@code MemorySegment} taken
 * from the buffer before its release still points at the slot afterwards,
 * and the slot goes to its next owner: using such a view after the release
 * reads or writes another owner's bytes. Netty's {@code ByteBuf.nioBuffer()}
 * has the same hazard. Drop views before releasing; to catch a stale view,
 * run with {@code checkUseAfterRelease} (or
 * {@code -Dbufpool.checkUseAfterRelease=true}): a stale view then throws at
 * its use.
 *
 * <p><b>Thread safety.</b> The buffer's bytes are the holder's to
 * synchronize; release() may race with itself safely.
 */
public final class PooledBuffer implements AutoCloseable {
  final BufferPool pool;
  final long address;
  final int slot;
  final int generation;
  /** The debug mode's views (an arena of their own) or null. */
  private final MemorySegment ownSegment;
  final Arena ownArena;
  /** The Cleaner's record when this buffer is tracked; else null. */
  BufferPool.Tracker tracker;
  private MemorySegment segment;
  private volatile int released;
  // An updater rather than a VarHandle: the same code once compiled, and
  // far cheaper in a JVM that has just started (no LambdaForms to spin).
  private static final AtomicIntegerFieldUpdater<PooledBuffer> RELEASED =
      AtomicIntegerFieldUpdater.newUpdater(PooledBuffer.class, "released");

  PooledBuffer(BufferPool pool, long address, int slot, int generation,
               MemorySegment ownSegment, Arena ownArena) {
    this.pool = pool;
    this.address = address;
    this.slot = slot;
    this.generation = generation;
    this.ownSegment = ownSegment;
    this.ownArena = ownArena;
  }

  /**
   * The buffer's bytes as a segment of {@code bufferSize} bytes: a slice of
   * the pool's region (the same object on every call). Valid until the
   * release (see the hazard above) and never past the pool's close().
   */
  public MemorySegment segment() {
    check("segment");
    MemorySegment s = ownSegment != null ? ownSegment : segment;
    if (s == null) {
      s = segment = pool.slice(slot);
    }
    return s;
  }

  /**
   * A new direct {@code ByteBuffer} over the buffer's bytes: position 0,
   * limit and capacity {@code bufferSize}, big-endian. Each call returns a
   * new view; every view has the hazard above.
   */
  public ByteBuffer byteBuffer() {
    check("byteBuffer");
    return segment().asByteBuffer();
  }

  /** The buffer's native address (for native code). */
  public long address() {
    check("address");
    return address;
  }

  /** Bytes in the buffer. */
  public int size() {
    check("size");
    return pool.bufferSize();
  }

  /** The buffer's index in its pool's region. */
  public int slot() {
    check("slot");
    return slot;
  }

  /** The pool this buffer came from (never refused). */
  public BufferPool pool() {
    return pool;
  }

  /** Whether release() has run. */
  public boolean isReleased() {
    return released != 0;
  }

  /** Gives the buffer back to its pool; later calls do nothing. */
  public void release() {
    if (markReleased()) {
      pool.release(this);
    }
  }

  /** The same as {@link #release()}, for try-with-resources. */
  @Override
  public void close() {
    release();
  }

  /** Flips the state once: true for the one caller that may release. */
  boolean markReleased() {
    return released == 0 && RELEASED.compareAndSet(this, 0, 1);
  }

  private void check(String accessor) {
    if (released != 0) {
      throw new IllegalStateException(this + "." + accessor + "(): the buffer was released");
    }
    if (pool.isClosed()) {
      throw new IllegalStateException(this + "." + accessor + "(): its pool is closed");
    }
  }

  static String describe(String poolLabel, int slot) {
    return "PooledBuffer[slot " + slot + (poolLabel.isEmpty() ? "" : " of pool" + poolLabel) + "]";
  }

  @Override
  public String toString() {
    String s = describe(pool.label(), slot);
    return released != 0 ? s.substring(0, s.length() - 1) + ", released]" : s;
  }
}
