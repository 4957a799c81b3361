package io.bufpool;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.ref.Cleaner;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CancellationException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * A pool of same-sized, page-aligned direct buffers: libbufpool's
 * {@code BufferPool} (through its C API, {@code bufpool/c.h}) for Java.
 *
 * <pre>{@code
 * try (BufferPool pool = BufferPool.create(
 *          BufferPool.options().bufferSize(4096).bufferCount(10_000))) {
 *   try (PooledBuffer b = pool.acquire()) {   // tryAcquire(): null when none free
 *     ByteBuffer bb = b.byteBuffer();         // 4096 bytes, page-aligned
 *     bb.putLong(0, 42);
 *   }                                         // released exactly once
 * }
 * }</pre>
 *
 * <p><b>Memory.</b> The pool maps one region of {@code bufferSize x
 * bufferCount} bytes when it is created and keeps it until it is closed; it
 * is one {@link MemorySegment} ({@link #region()}), and every buffer is a
 * slice of it. No buffer has an {@code Arena} of its own (outside the
 * use-after-release check). Closing the pool closes the region's arena, so a
 * view used after the pool is closed throws instead of touching unmapped
 * memory.
 *
 * <p><b>Speed.</b> An acquire and a release are one short native call each
 * ({@code Linker.Option.critical}): the library keeps a cache of free
 * buffers per CPU, so the per-thread cache a Java pool would otherwise need
 * is already there, bounded by the number of CPUs rather than of threads
 * (virtual threads included). {@link #acquireBulk} and {@link #releaseAll}
 * move many buffers in one call.
 *
 * <p><b>Thread safety.</b> Every method may be called from any number of
 * threads at once, platform or virtual, except {@link #close()}, which must
 * come after every other call on the pool has returned. A buffer may be
 * released on another thread than the one that acquired it.
 *
 * <p><b>Leaks.</b> A {@link PooledBuffer} that becomes unreachable without
 * being released comes back to the pool through a {@link Cleaner} when it is
 * tracked, with a line naming it and where it was acquired, logged (logger
 * {@code io.bufpool}, WARNING) and kept for {@link #holdersReport()}. Which
 * buffers are tracked: {@link LeakDetection} (default: one acquire in
 * {@code leakSampleEvery}, as Netty's leak detector samples).
 */
public final class BufferPool implements AutoCloseable {
  /** Which acquired buffers a {@link Cleaner} watches for leaks. */
  public enum LeakDetection {
    /** None: a forgotten buffer stays out until the pool is closed. */
    OFF,
    /** One acquire in {@code leakSampleEvery} (random), with its stack. */
    SAMPLED,
    /** Every acquire, with its stack (tests, leak hunts; slow). */
    ALL
  }

  /** Values of {@link Options#hugePages}. */
  public enum HugePages {
    /** 4 KiB pages only. */
    NEVER,
    /** Advise transparent huge pages (2 MiB). */
    TRY,
    /** MAP_HUGETLB, or create() fails. */
    REQUIRE
  }

  /** Values of {@link Options#trackHolders}: the library's holder tracking. */
  public enum TrackHolders {
    /** Nothing recorded. */
    OFF,
    /** One acquire in {@code holderSampleEvery}. */
    SAMPLED,
    /** Every acquire. */
    ALL
  }

  /**
   * What {@link #create(Options)} builds: the C API's {@code bufpool_options}
   * (defaults the library's) and this binding's own checks. Setters return
   * this options object.
   */
  public static final class Options {
    long bufferSize = 4096;
    long bufferCount = 1024;
    long maxBufferCount = 0;
    long growStep = 512;
    HugePages hugePages = HugePages.TRY;
    boolean populate = true;
    boolean lockMemory = false;
    boolean scrubOnRelease = false;
    long cacheSize = 64;
    TrackHolders trackHolders = TrackHolders.OFF;
    int holderSampleEvery = 128;
    String name = "";
    LeakDetection leakDetection = leakDetectionDefault();
    int leakSampleEvery = 1024;
    boolean checkUseAfterRelease = Boolean.getBoolean("bufpool.checkUseAfterRelease");

    Options() {}

    /** Bytes per buffer: a power of two, at least 64 (default 4096). */
    public Options bufferSize(long bytes) { bufferSize = bytes; return this; }
    /** Buffers (default 1,024); an elastic pool's initial count. */
    public Options bufferCount(long count) { bufferCount = count; return this; }
    /** An elastic pool's ceiling (0, the default: a fixed pool). */
    public Options maxBufferCount(long count) { maxBufferCount = count; return this; }
    /** An elastic pool's growth step in buffers (default 512). */
    public Options growStep(long buffers) { growStep = buffers; return this; }
    /** Huge pages for the region (default TRY). */
    public Options hugePages(HugePages h) { hugePages = h; return this; }
    /** Fault every page in at create (default true). */
    public Options populate(boolean on) { populate = on; return this; }
    /** mlock the region (default false; RLIMIT_MEMLOCK applies). */
    public Options lockMemory(boolean on) { lockMemory = on; return this; }
    /** Zero each buffer as it is released (default false). */
    public Options scrubOnRelease(boolean on) { scrubOnRelease = on; return this; }
    /** Free buffers cached per CPU, at most 512; 0: none (default 64). */
    public Options cacheSize(long buffers) { cacheSize = buffers; return this; }
    /** The library's holder tracking, for {@link #holdersReport()}. */
    public Options trackHolders(TrackHolders t) { trackHolders = t; return this; }
    /** With {@code TrackHolders.SAMPLED}: one acquire in this many. */
    public Options holderSampleEvery(int n) { holderSampleEvery = n; return this; }
    /** A name for messages and reports (default none). */
    public Options name(String n) { name = n == null ? "" : n; return this; }
    /**
     * Which buffers a Cleaner watches (default SAMPLED, or the system
     * property {@code bufpool.leakDetection}: off, sampled, all).
     */
    public Options leakDetection(LeakDetection l) { leakDetection = l; return this; }
    /** With {@code LeakDetection.SAMPLED}: one acquire in this many (default 1,024). */
    public Options leakSampleEvery(int n) { leakSampleEvery = n; return this; }
    /**
     * The debug mode (default off, or the system property
     * {@code bufpool.checkUseAfterRelease=true}): each buffer's views get an
     * arena of their own that release closes, so a {@code ByteBuffer} or
     * {@code MemorySegment} taken from a buffer and used after its release
     * throws {@code IllegalStateException} at the use, instead of reading
     * or writing the buffer's next owner's bytes. Costs a shared arena per
     * acquire (microseconds): for tests and hunts, not production.
     */
    public Options checkUseAfterRelease(boolean on) { checkUseAfterRelease = on; return this; }
  }

  /**
   * A snapshot of the pool's counters: the library's ({@code bufpool_stats};
   * see {@code PoolStats} in bufpool/buffer_pool.h for when each is exact)
   * and the Cleaner's.
   *
   * @param capacity buffers (an elastic pool: its ceiling)
   * @param inUse held by users now
   * @param highWater never below the most held at once
   * @param acquireFailures tries that got nothing; bulk acquires that fell short
   * @param acquireTimeouts waiting acquires that timed out
   * @param cached free buffers parked in the per-CPU caches
   * @param committed buffers backed by memory now
   * @param grows an elastic pool's growth steps
   * @param trims trims that gave memory back
   * @param growFailures growth steps the system refused
   * @param leaks tracked buffers the Cleaner brought back
   */
  public record Stats(long capacity, long inUse, long highWater, long acquireFailures,
                      long acquireTimeouts, long cached, long committed, long grows,
                      long trims, long growFailures, long leaks) {}

  /** Thrown by {@link #acquire(Duration)} when no buffer came free in time. */
  public static final class AcquireTimeoutException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    AcquireTimeoutException(String message) { super(message); }
  }

  /** A new options object with the library's defaults. */
  public static Options options() {
    return new Options();
  }

  /** A pool with the library's defaults (1,024 buffers of 4 KiB). */
  public static BufferPool create() {
    return create(options());
  }

  /**
   * Maps and slices the region. Throws {@code IllegalArgumentException} with
   * the library's message (naming the field and its value) for a bad option,
   * {@code IllegalStateException} for a system refusal (memory, limits).
   */
  public static BufferPool create(Options o) {
    if (o.leakSampleEvery < 1) {
      throw new IllegalArgumentException(
          "BufferPool: leakSampleEvery must be >= 1, got " + o.leakSampleEvery);
    }
    long handle;
    try (Arena a = Arena.ofConfined()) {
      MemorySegment opts = a.allocate(Native.OPTIONS_SIZE, 8);
      Native.Setup.OPTIONS_INIT.invokeExact(opts, Native.OPTIONS_SIZE);
      opts.set(JAVA_LONG, Native.OPT_BUFFER_SIZE, o.bufferSize);
      opts.set(JAVA_LONG, Native.OPT_BUFFER_COUNT, o.bufferCount);
      opts.set(JAVA_INT, Native.OPT_HUGE_PAGES, o.hugePages.ordinal());
      opts.set(JAVA_INT, Native.OPT_POPULATE, o.populate ? 1 : 0);
      opts.set(JAVA_INT, Native.OPT_LOCK_MEMORY, o.lockMemory ? 1 : 0);
      opts.set(JAVA_INT, Native.OPT_SCRUB_ON_RELEASE, o.scrubOnRelease ? 1 : 0);
      opts.set(JAVA_LONG, Native.OPT_CACHE_SIZE, o.cacheSize);
      opts.set(JAVA_LONG, Native.OPT_MAX_BUFFER_COUNT, o.maxBufferCount);
      opts.set(JAVA_LONG, Native.OPT_GROW_STEP, o.growStep);
      opts.set(JAVA_INT, Native.OPT_TRACK_HOLDERS, o.trackHolders.ordinal());
      opts.set(JAVA_INT, Native.OPT_HOLDER_SAMPLE_EVERY, o.holderSampleEvery);
      MemorySegment err = a.allocate(ADDRESS);
      handle = (long) Native.Setup.CREATE.invokeExact(opts, err);
      if (handle == 0) {
        String msg = Native.takeError(err);
        String text = "BufferPool.create: " + msg;
        if (msg != null && msg.startsWith("INVALID_ARGUMENT")) {
          throw new IllegalArgumentException(text);
        }
        throw new IllegalStateException(text);
      }
    } catch (RuntimeException | Error e) {
      throw e;
    } catch (Throwable t) {
      throw Native.rethrow(t);
    }
    return new BufferPool(handle, o);
  }

  // ---- State -------------------------------------------------------------

  /** The library's pool (bufpool_pool*); 0 once destroyed. */
  private long handle;
  private final long base;
  private final long regionLength;
  private final int shift;
  private final int bufferSize;
  private final int capacity;
  private final String name;
  private final LeakDetection leakDetection;
  private final int leakSampleEvery;
  private final boolean checkUseAfterRelease;
  private final Arena regionArena = Arena.ofShared();
  private final MemorySegment region;

  /**
   * Per slot: even while free, odd while out; each acquire and release adds
   * one. Written by the slot's owner only, with plain accesses: the
   * library's release and acquire of the slot (a release store and an
   * acquire load in its cache or depot) order one owner's writes before the
   * next owner's. Read by close() and the reports to name what is out.
   */
  private final int[] generations;

  /** Set once by close(); read by every release and accessor. */
  private volatile boolean closing;
  private boolean destroyed;  // guarded by this

  // Virtual threads wait here, not in the library (a thread blocked in a
  // native call pins its carrier): releases signal while waiters is not 0.
  private final ReentrantLock waitLock = new ReentrantLock();
  private final Condition freed = waitLock.newCondition();
  private final AtomicInteger virtualWaiters = new AtomicInteger();
  private static final long MAX_PARK_NANOS = TimeUnit.MILLISECONDS.toNanos(1);

  /** Empty tries made while waiting: not failures of the caller's call. */
  private final LongAdder waitTries = new LongAdder();
  private final LongAdder javaTimeouts = new LongAdder();

  /** Tracked buffers out (leak detection), and the leaks found. */
  final Set<Tracker> tracked = ConcurrentHashMap.newKeySet();
  private final AtomicLong leaks = new AtomicLong();
  private final List<String> leakLines = new ArrayList<>();  // guarded by itself
  private static final int MAX_LEAK_LINES = 64;
  private static final System.Logger LOG = System.getLogger("io.bufpool");

  private BufferPool(long handle, Options o) {
    this.handle = handle;
    this.name = o.name;
    this.leakDetection = o.leakDetection;
    this.leakSampleEvery = o.leakSampleEvery;
    this.checkUseAfterRelease = o.checkUseAfterRelease;
    try (Arena a = Arena.ofConfined()) {
      MemorySegment basePtr = a.allocate(ADDRESS);
      MemorySegment length = a.allocate(JAVA_LONG);
      Native.Setup.REGION.invokeExact(handle, basePtr, length);
      this.base = basePtr.get(ADDRESS, 0).address();
      this.regionLength = length.get(JAVA_LONG, 0);
    } catch (Throwable t) {
      throw Native.rethrow(t);
    }
    this.bufferSize = Math.toIntExact(o.bufferSize);
    this.shift = Integer.numberOfTrailingZeros(bufferSize);
    this.capacity = Math.toIntExact(Math.max(o.bufferCount, o.maxBufferCount));
    this.generations = new int[capacity];
    this.region = MemorySegment.ofAddress(base).reinterpret(regionLength, regionArena, null);
  }

  private static LeakDetection leakDetectionDefault() {
    String p = System.getProperty("bufpool.leakDetection", "sampled");
    try {
      return LeakDetection.valueOf(p.trim().toUpperCase(java.util.Locale.ROOT));
    } catch (IllegalArgumentException e) {
      throw new IllegalArgumentException(
          "bufpool.leakDetection must be off, sampled or all, got '" + p + "'", e);
    }
  }

  // ---- Acquire -------------------------------------------------------------

  /**
   * A free buffer, or null when none is free anywhere in the pool (counted
   * in {@code acquireFailures}). Never waits. Throws
   * {@code IllegalStateException} once the pool is closed.
   */
  public PooledBuffer tryAcquire() {
    checkOpen();
    long address;
    try {
      address = (long) Native.Hot.TRY_ACQUIRE.invokeExact(handle);
    } catch (Throwable t) {
      throw Native.rethrow(t);
    }
    return address == 0 ? null : wrap(address);
  }

  /** Waits as long as it takes for a buffer: {@link #acquire(Duration)} forever. */
  public PooledBuffer acquire() {
    return acquire(null);
  }

  /**
   * A buffer: at once when one is free, else waits until one is released
   * or {@code timeout} passes (null: forever), then throws
   * {@link AcquireTimeoutException}, counted in {@code acquireTimeouts}
   * (a timeout of zero or less does not wait: a failure, counted in
   * {@code acquireFailures}, as in the library). A platform thread waits in the library
   * (not interruptible); a virtual thread waits in Java, unmounted, and
   * throws {@code CancellationException} when interrupted.
   */
  public PooledBuffer acquire(Duration timeout) {
    PooledBuffer b = tryAcquire();
    if (b != null) {
      return b;
    }
    long nanos = timeout == null ? Long.MAX_VALUE : saturatedNanos(timeout);
    if (nanos <= 0) {
      // As in the library: no wait, and the empty try is a failure.
      throw new AcquireTimeoutException(
          "BufferPool" + label() + ".acquire: every buffer is in use (timeout " + timeout + ")");
    }
    waitTries.increment();  // the try above was the wait's
    return Thread.currentThread().isVirtual() ? waitVirtual(nanos, timeout) : waitNative(nanos);
  }

  /** tryAcquire() whose empty result is not the caller's failure. */
  private PooledBuffer tryAcquireWaiting() {
    PooledBuffer b = tryAcquire();
    if (b == null) {
      waitTries.increment();
    }
    return b;
  }

  private PooledBuffer waitNative(long nanos) {
    try (Arena a = Arena.ofConfined()) {
      MemorySegment err = a.allocate(ADDRESS);
      long address = (long) Native.Wait.ACQUIRE.invokeExact(handle, nanos, err);
      if (address == 0) {
        throw new AcquireTimeoutException("BufferPool" + label() + ".acquire: "
            + Native.takeError(err));
      }
      return wrap(address);
    } catch (RuntimeException | Error e) {
      throw e;
    } catch (Throwable t) {
      throw Native.rethrow(t);
    }
  }

  private PooledBuffer waitVirtual(long nanos, Duration timeout) {
    final long deadline = System.nanoTime() + nanos;
    virtualWaiters.incrementAndGet();
    try {
      while (true) {
        // Registered before this try: a release after it signals us. One
        // between the library's push and the release's read of
        // virtualWaiters can be missed; the 1 ms park bounds that wait.
        PooledBuffer b = tryAcquireWaiting();
        if (b != null) {
          return b;
        }
        long left = deadline - System.nanoTime();
        if (left <= 0) {
          javaTimeouts.increment();
          throw new AcquireTimeoutException("BufferPool" + label()
              + ".acquire: DEADLINE_EXCEEDED: every buffer stayed in use for " + timeout);
        }
        waitLock.lock();
        try {
          freed.awaitNanos(Math.min(left, MAX_PARK_NANOS));
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new CancellationException("BufferPool" + label()
              + ".acquire: interrupted while waiting for a buffer");
        } finally {
          waitLock.unlock();
        }
      }
    } finally {
      virtualWaiters.decrementAndGet();
    }
  }

  private static long saturatedNanos(Duration d) {
    try {
      return d.toNanos();
    } catch (ArithmeticException e) {
      return d.isNegative() ? Long.MIN_VALUE : Long.MAX_VALUE;
    }
  }

  /**
   * n buffers, or null when fewer than n were free (then none is taken and
   * one failure is counted): one native call. Never waits.
   */
  public PooledBuffer[] acquireBulk(int n) {
    checkOpen();
    if (n < 0) {
      throw new IllegalArgumentException("BufferPool.acquireBulk: n must be >= 0, got " + n);
    }
    long[] addresses = new long[n];
    MemorySegment out = MemorySegment.ofArray(addresses);
    long got;
    try {
      got = (long) Native.Bulk.TRY_ACQUIRE_BULK.invokeExact(handle, out, (long) n);
      if (got < n) {
        if (got > 0) {
          Native.Bulk.RELEASE_BULK.invokeExact(handle, out, got);
        }
        return null;
      }
    } catch (Throwable t) {
      throw Native.rethrow(t);
    }
    PooledBuffer[] buffers = new PooledBuffer[n];
    for (int i = 0; i < n; i++) {
      buffers[i] = wrap(addresses[i]);
    }
    return buffers;
  }

  private PooledBuffer wrap(long address) {
    int slot = (int) ((address - base) >>> shift);
    int gen = generations[slot] + 1;
    generations[slot] = gen;
    PooledBuffer b;
    if (checkUseAfterRelease) {
      Arena own = Arena.ofShared();
      b = new PooledBuffer(this, address, slot, gen,
          MemorySegment.ofAddress(address).reinterpret(bufferSize, own, null), own);
    } else {
      b = new PooledBuffer(this, address, slot, gen, null, null);
    }
    if (leakDetection != LeakDetection.OFF
        && (leakDetection == LeakDetection.ALL
            || ThreadLocalRandom.current().nextInt(leakSampleEvery) == 0)) {
      track(b);
    }
    return b;
  }

  // ---- Release -------------------------------------------------------------

  /** The release of b, whose state its caller has flipped (exactly once). */
  void release(PooledBuffer b) {
    forget(b);
    try {
      Native.Hot.RELEASE.invokeExact(handle, b.address);
    } catch (Throwable t) {
      throw Native.rethrow(t);
    }
    afterRelease(false);
  }

  /** The Java side of a release, before the library gets the buffer. */
  private void forget(PooledBuffer b) {
    Tracker t = b.tracker;
    if (t != null) {
      t.released = true;
      tracked.remove(t);
      t.cleanable.clean();
    }
    if (b.ownArena != null) {
      try {
        b.ownArena.close();
      } catch (IllegalStateException inUse) {
        // An I/O call on another thread holds one of its views: giving the
        // buffer to a next owner now would let that call write into it.
        throw new IllegalStateException(PooledBuffer.describe(label(), b.slot)
            + " was released while one of its views is in use by another thread;"
            + " the buffer stays out of the pool", inUse);
      }
    }
    generations[b.slot] = b.generation + 1;
  }

  private void afterRelease(boolean many) {
    if (virtualWaiters.get() != 0) {
      waitLock.lock();
      try {
        if (many) {
          freed.signalAll();
        } else {
          freed.signal();
        }
      } finally {
        waitLock.unlock();
      }
    }
    if (closing) {
      destroyIfIdle();
    }
  }

  /**
   * Releases every buffer of {@code buffers} that is not null and not
   * released yet, in one native call. Throws IllegalArgumentException,
   * releasing none, when one is another pool's.
   */
  public void releaseAll(PooledBuffer... buffers) {
    for (PooledBuffer b : buffers) {
      if (b != null && b.pool != this) {
        throw new IllegalArgumentException("BufferPool" + label() + ".releaseAll: " + b
            + " is not from this pool");
      }
    }
    long[] addresses = new long[buffers.length];
    int n = 0;
    RuntimeException failed = null;
    for (PooledBuffer b : buffers) {
      if (b != null && b.markReleased()) {
        try {
          forget(b);
          addresses[n++] = b.address;
        } catch (RuntimeException e) {  // that one stays out; the rest go back
          failed = failed == null ? e : failed;
        }
      }
    }
    if (n > 0) {
      try {
        Native.Bulk.RELEASE_BULK.invokeExact(handle, MemorySegment.ofArray(addresses), (long) n);
      } catch (Throwable t) {
        throw Native.rethrow(t);
      }
      afterRelease(n > 1);
    }
    if (failed != null) {
      throw failed;
    }
  }

  // ---- Leak detection --------------------------------------------------------

  /** What a Cleaner keeps of a tracked buffer: never the buffer itself. */
  static final class Tracker implements Runnable {
    final BufferPool pool;
    final long address;
    final int slot;
    final int generation;
    final String thread;
    final Throwable site;
    volatile boolean released;
    Cleaner.Cleanable cleanable;

    Tracker(BufferPool pool, PooledBuffer b) {
      this.pool = pool;
      this.address = b.address;
      this.slot = b.slot;
      this.generation = b.generation;
      this.thread = Thread.currentThread().getName();
      this.site = new Throwable("acquired");
    }

    @Override
    public void run() {
      if (!released) {
        pool.leaked(this);
      }
    }
  }

  private static final class CleanerHolder {
    static final Cleaner CLEANER = Cleaner.create();
  }

  private void track(PooledBuffer b) {
    Tracker t = new Tracker(this, b);
    b.tracker = t;
    tracked.add(t);
    t.cleanable = CleanerHolder.CLEANER.register(b, t);
  }

  /** On the Cleaner's thread: t's buffer became unreachable, still out. */
  private void leaked(Tracker t) {
    tracked.remove(t);
    String line = "LEAK: " + PooledBuffer.describe(label(), t.slot)
        + " became unreachable without close(); brought back to the pool. Acquired by thread \""
        + t.thread + "\"" + site(t.site);
    synchronized (leakLines) {
      if (leakLines.size() < MAX_LEAK_LINES) {
        leakLines.add(line);
      }
    }
    LOG.log(System.Logger.Level.WARNING, line);
    generations[t.slot] = t.generation + 1;
    try {
      Native.Hot.RELEASE.invokeExact(handle, t.address);
    } catch (Throwable e) {
      throw Native.rethrow(e);
    }
    leaks.incrementAndGet();  // after the release: a reader that sees it sees the buffer back
    afterRelease(false);
  }

  private static final Set<String> OWN_CLASSES = Set.of(
      BufferPool.class.getName(), PooledBuffer.class.getName(), Native.class.getName());

  private static String site(Throwable site) {
    StringBuilder sb = new StringBuilder();
    StackTraceElement[] frames = site.getStackTrace();
    boolean inside = true;
    int shown = 0;
    for (StackTraceElement f : frames) {
      // Leave out this binding's own frames, down to the caller's.
      if (inside && OWN_CLASSES.contains(f.getClassName().split("\\$", 2)[0])) {
        continue;
      }
      inside = false;
      sb.append("\n    at ").append(f);
      if (++shown == 12) {
        break;
      }
    }
    return sb.toString();
  }

  // ---- Observing -------------------------------------------------------------

  /** The library's counters and the Cleaner's, now. */
  public Stats stats() {
    long[] w = new long[Native.STATS_WORDS];
    synchronized (this) {
      if (handle != 0) {
        try {
          Native.Admin.GET_STATS.invokeExact(handle, MemorySegment.ofArray(w), (long) (8 * w.length));
        } catch (Throwable t) {
          throw Native.rethrow(t);
        }
      }
    }
    // w[0] is struct_size.
    return new Stats(capacity, w[2], w[3], Math.max(0, w[4] - waitTries.sum()),
        w[5] + javaTimeouts.sum(), w[6], w[7], w[8], w[9], w[10], leaks.get());
  }

  /**
   * Who holds the pool's buffers: the library's report
   * ({@code bufpool_holders_report}; acquire sites with
   * {@code trackHolders}), then this binding's: the buffers out by slot,
   * the tracked ones by the Java stack that acquired them, and every leak
   * the Cleaner found.
   */
  public String holdersReport() {
    StringBuilder sb = new StringBuilder();
    synchronized (this) {
      if (handle != 0) {
        sb.append(nativeText(true));
      } else {
        sb.append("the library's pool is destroyed\n");
      }
    }
    List<Integer> out = slotsOut();
    sb.append("Java (io.bufpool) pool").append(label()).append(": ").append(out.size())
        .append(" buffer(s) out");
    if (!out.isEmpty()) {
      sb.append(" (slots ").append(slotList(out)).append(')');
    }
    sb.append("; leak detection ").append(leakDetection.name().toLowerCase(java.util.Locale.ROOT));
    if (leakDetection == LeakDetection.SAMPLED) {
      sb.append(" (1 in ").append(leakSampleEvery).append(')');
    }
    sb.append(", ").append(leaks.get()).append(" leak(s) found\n");
    Map<String, Integer> sites = new LinkedHashMap<>();
    for (Tracker t : tracked) {
      sites.merge("thread \"" + t.thread + "\"" + site(t.site), 1, Integer::sum);
    }
    for (Map.Entry<String, Integer> e : sites.entrySet()) {
      sb.append("  ").append(e.getValue()).append(" tracked buffer(s) out, acquired by ")
          .append(e.getKey()).append('\n');
    }
    synchronized (leakLines) {
      for (String l : leakLines) {
        sb.append("  ").append(l).append('\n');
      }
    }
    return sb.toString();
  }

  /** The pool's metrics in the Prometheus text format, labelled with its name. */
  public String metrics() {
    synchronized (this) {
      if (handle == 0) {
        return "";
      }
      return nativeText(false);
    }
  }

  private String nativeText(boolean holders) {
    try (Arena a = Arena.ofConfined()) {
      MemorySegment label = a.allocateFrom(name);
      long size = 4096;
      while (true) {
        MemorySegment buf = a.allocate(size);
        long n = holders
            ? (long) Native.Admin.HOLDERS_REPORT.invokeExact(handle, 32L, buf, size)
            : (long) Native.Admin.WRITE_METRICS.invokeExact(handle, label, buf, size);
        if (n < size) {
          return buf.getString(0);
        }
        size = n + 1;
      }
    } catch (Throwable t) {
      throw Native.rethrow(t);
    }
  }

  /** Moves every CPU's cached free buffers back to the shared depot. */
  public void flushCaches() {
    checkOpen();
    try {
      Native.Admin.FLUSH_CACHES.invokeExact(handle);
    } catch (Throwable t) {
      throw Native.rethrow(t);
    }
  }

  /** The whole region: every buffer is a slice of it; valid until close(). */
  public MemorySegment region() {
    checkOpen();
    return region;
  }

  /** Bytes per buffer. */
  public int bufferSize() {
    return bufferSize;
  }

  /** Buffers (an elastic pool: its ceiling). */
  public int capacity() {
    return capacity;
  }

  /** The name from the options ("" when none). */
  public String name() {
    return name;
  }

  /** Where this binding loaded libbufpool from. */
  public static String libraryPath() {
    return Native.LIBRARY;
  }

  @Override
  public String toString() {
    return "BufferPool" + label() + "[" + capacity + " x " + bufferSize + " bytes"
        + (closing ? ", closed" : "") + "]";
  }

  // ---- Close -----------------------------------------------------------------

  /**
   * Closes the pool: acquires throw from now on, and every view of a
   * buffer (but under checkUseAfterRelease, whose views live until their
   * buffer's release) throws at its next use. With no buffer out, frees the
   * region at once. With buffers out, throws {@code IllegalStateException}
   * naming them (slots; where tracked buffers were acquired) and frees the
   * region when the last comes back, so nothing is unmapped under a holder.
   * A second call does nothing.
   */
  @Override
  public void close() {
    synchronized (this) {
      if (closing) {
        return;
      }
      closing = true;
    }
    try {
      regionArena.close();
    } catch (IllegalStateException busy) {
      // A thread is inside a bulk access to the region; its views stay
      // valid until the library's pool is destroyed below.
    }
    if (destroyIfIdle()) {
      return;
    }
    List<Integer> out = slotsOut();
    StringBuilder sb = new StringBuilder("BufferPool" + label() + ".close: "
        + out.size() + " buffer(s) still out (slots " + slotList(out) + ")");
    for (Tracker t : tracked) {
      sb.append("; ").append(PooledBuffer.describe(label(), t.slot))
          .append(" acquired by thread \"").append(t.thread).append('"').append(site(t.site));
    }
    sb.append(". The pool's memory is freed when they are all released.");
    throw new IllegalStateException(sb.toString());
  }

  /** After close(): destroys the library's pool once nothing is out. */
  private synchronized boolean destroyIfIdle() {
    if (destroyed) {
      return true;
    }
    long[] w = new long[Native.STATS_WORDS];
    try {
      Native.Admin.GET_STATS.invokeExact(handle, MemorySegment.ofArray(w), (long) (8 * w.length));
      if (w[2] != 0) {
        return false;
      }
      if (regionArena.scope().isAlive()) {
        regionArena.close();
      }
      Native.Admin.DESTROY.invokeExact(handle);
    } catch (Throwable t) {
      throw Native.rethrow(t);
    }
    handle = 0;
    destroyed = true;
    return true;
  }

  private List<Integer> slotsOut() {
    List<Integer> out = new ArrayList<>();
    for (int i = 0; i < generations.length; i++) {
      if ((generations[i] & 1) != 0) {
        out.add(i);
      }
    }
    return out;
  }

  private static String slotList(List<Integer> slots) {
    StringBuilder sb = new StringBuilder();
    for (int i = 0; i < slots.size(); i++) {
      if (i == 16) {
        sb.append(", ... ").append(slots.size() - 16).append(" more");
        break;
      }
      if (i > 0) {
        sb.append(", ");
      }
      sb.append(slots.get(i));
    }
    return sb.toString();
  }

  // ---- For PooledBuffer --------------------------------------------------------

  void checkOpen() {
    if (closing) {
      throw new IllegalStateException("BufferPool" + label() + " is closed");
    }
  }

  boolean isClosed() {
    return closing;
  }

  String label() {
    return name.isEmpty() ? "" : " \"" + name + "\"";
  }

  MemorySegment slice(int slot) {
    return region.asSlice((long) slot << shift, bufferSize);
  }
}
