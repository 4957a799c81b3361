// The acquire + release pair from Java, and the seed experiment in a warm
// JVM, contender by contender in one JVM, interleaved: every round runs
// every contender once (all warmed up before the first round), starting at
// a different one each round, so a slow phase of the machine falls on
// different contenders. Prints one JSON line per contender per round:
// {"workload": "pair", "contender", "round", "ns", "wall_ns"} (per pair) and
// {"workload": "seed10k", "contender", "round", "ms", "wall_ms"}.
//
// ns and ms are the thread's CPU time (CLOCK_THREAD_CPUTIME_ID): on a shared
// machine a round of 50 ms that loses the CPU for 400 ms to another tenant
// says nothing about the code; wall_* is the elapsed time. Work done for a
// contender on other threads (the collector's, the JDK's Cleaner freeing
// direct buffers) is not in its CPU time, so the allocateDirect rows are, if
// anything, flattered.
//
//   java --enable-native-access=ALL-UNNAMED -XX:MaxDirectMemorySize=1g \
//        -cp bufpool.jar:netty-buffer.jar:netty-common.jar:. PairBench [rounds] [pairs]
//
// Pair contenders (each pair acquires a 4 KiB buffer, writes one byte, releases):
//   java_bufpool_pair         BufferPool.acquire() + close(), leak detection
//                             sampled (the default, 1 in 1,024)
//   java_bufpool_pair_leak_off  the same with leak detection off
//   java_bufpool_try_pair     tryAcquire() + close()
//   java_netty_pooled_pair    PooledByteBufAllocator.DEFAULT.directBuffer(4096)
//                             + release() (Netty's per-thread caches)
//   java_ffm_floor            bufpool_try_acquire + bufpool_release as raw
//                             critical downcalls: what the binding adds to
// Seed contenders (obtain 10,000 buffers of 4 KiB, write each once; then
// let them go: release, or drop for the collector and the direct-memory
// Cleaner, which a later allocateDirect may have to wait for, as in a
// program):
//   java_seed10k_allocateDirect_each    10,000 ByteBuffer.allocateDirect(4096)
//   java_seed10k_allocateDirect_sliced  one allocateDirect(10,000 x 4096), 10,000 slice()s
//   java_seed10k_bufpool_bulk           acquireBulk(10,000) from a pool of 10,000
//   java_seed10k_bufpool_each           10,000 acquire() from it
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import io.bufpool.BufferPool;
import io.bufpool.PooledBuffer;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.PooledByteBufAllocator;
import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.invoke.MethodHandle;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.function.IntToLongFunction;

public final class PairBench {
  static volatile long sink;

  record Contender(String name, IntToLongFunction run) {}

  public static void main(String[] args) throws Throwable {
    int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 7;
    int pairs = args.length > 1 ? Integer.parseInt(args[1]) : 2_000_000;
    BufferPool sampled = BufferPool.create(BufferPool.options().bufferSize(4096).bufferCount(1024));
    BufferPool off = BufferPool.create(BufferPool.options().bufferSize(4096).bufferCount(1024)
        .leakDetection(BufferPool.LeakDetection.OFF));
    Floor floor = new Floor();
    PooledByteBufAllocator netty = PooledByteBufAllocator.DEFAULT;

    List<Contender> cs = new ArrayList<>();
    cs.add(new Contender("java_bufpool_pair", n -> bufpoolPair(sampled, n)));
    cs.add(new Contender("java_bufpool_pair_leak_off", n -> bufpoolPair(off, n)));
    cs.add(new Contender("java_bufpool_try_pair", n -> bufpoolTryPair(off, n)));
    cs.add(new Contender("java_netty_pooled_pair", n -> nettyPair(netty, n)));
    cs.add(new Contender("java_ffm_floor", n -> floor.pairs(n)));

    BufferPool seedPool = BufferPool.create(BufferPool.options().bufferSize(4096).bufferCount(SEED));
    List<Contender> seed = new ArrayList<>();
    seed.add(new Contender("java_seed10k_allocateDirect_each", n -> seedDirectEach()));
    seed.add(new Contender("java_seed10k_allocateDirect_sliced", n -> seedSliced()));
    seed.add(new Contender("java_seed10k_bufpool_bulk", n -> seedPool(seedPool, true)));
    seed.add(new Contender("java_seed10k_bufpool_each", n -> seedPool(seedPool, false)));

    ThreadMXBean cpu = ManagementFactory.getThreadMXBean();
    for (int i = 0; i < 5; i++) {  // warm-up: compiled before round 1
      for (Contender c : cs) {
        sink += c.run.applyAsLong(pairs / 5);
      }
      for (Contender c : seed) {
        sink += c.run.applyAsLong(0);
      }
    }
    for (int r = 0; r < rounds; r++) {
      for (int i = 0; i < cs.size(); i++) {
        Contender c = cs.get((i + r) % cs.size());
        long c0 = cpu.getCurrentThreadCpuTime();
        long t0 = System.nanoTime();
        sink += c.run.applyAsLong(pairs);
        long wall = System.nanoTime() - t0;
        long used = cpu.getCurrentThreadCpuTime() - c0;
        System.out.printf("{\"workload\": \"pair\", \"contender\": \"%s\", \"round\": %d, "
            + "\"ns\": %.2f, \"wall_ns\": %.2f}%n",
            c.name, r + 1, used / (double) pairs, wall / (double) pairs);
      }
      for (int i = 0; i < seed.size(); i++) {
        Contender c = seed.get((i + r) % seed.size());
        long c0 = cpu.getCurrentThreadCpuTime();
        long t0 = System.nanoTime();
        sink += c.run.applyAsLong(0);
        long wall = System.nanoTime() - t0;
        long used = cpu.getCurrentThreadCpuTime() - c0;
        System.out.printf("{\"workload\": \"seed10k\", \"contender\": \"%s\", \"round\": %d, "
            + "\"ms\": %.4f, \"wall_ms\": %.4f}%n", c.name, r + 1, used / 1e6, wall / 1e6);
      }
    }
    seedPool.close();
    sampled.close();
    off.close();
    floor.close();
  }

  static final int SEED = 10_000;
  static Object keep;  // the seed's buffers stay reachable until the next round

  static long seedDirectEach() {
    ByteBuffer[] b = new ByteBuffer[SEED];
    for (int i = 0; i < SEED; i++) {
      b[i] = ByteBuffer.allocateDirect(4096);
      b[i].put(0, (byte) 1);
    }
    keep = b;
    return b.length;
  }

  static long seedSliced() {
    ByteBuffer[] b = new ByteBuffer[SEED];
    ByteBuffer big = ByteBuffer.allocateDirect(SEED * 4096);
    for (int i = 0; i < SEED; i++) {
      b[i] = big.slice(i * 4096, 4096);
      b[i].put(0, (byte) 1);
    }
    keep = b;
    return b.length;
  }

  static long seedPool(BufferPool pool, boolean bulk) {
    PooledBuffer[] b;
    if (bulk) {
      b = pool.acquireBulk(SEED);
    } else {
      b = new PooledBuffer[SEED];
      for (int i = 0; i < SEED; i++) {
        b[i] = pool.acquire();
      }
    }
    for (PooledBuffer x : b) {
      x.segment().set(JAVA_BYTE, 0, (byte) 1);
    }
    keep = null;
    long n = b.length;
    pool.releaseAll(b);
    return n;
  }

  static long bufpoolPair(BufferPool pool, int n) {
    long s = 0;
    for (int i = 0; i < n; i++) {
      try (PooledBuffer b = pool.acquire()) {
        MemorySegment seg = b.segment();
        seg.set(JAVA_BYTE, 0, (byte) i);
        s += seg.address();
      }
    }
    return s;
  }

  static long bufpoolTryPair(BufferPool pool, int n) {
    long s = 0;
    for (int i = 0; i < n; i++) {
      PooledBuffer b = pool.tryAcquire();
      MemorySegment seg = b.segment();
      seg.set(JAVA_BYTE, 0, (byte) i);
      s += seg.address();
      b.close();
    }
    return s;
  }

  static long nettyPair(PooledByteBufAllocator alloc, int n) {
    long s = 0;
    for (int i = 0; i < n; i++) {
      ByteBuf b = alloc.directBuffer(4096);
      b.setByte(0, i);
      s += b.capacity();
      b.release();
    }
    return s;
  }

  /** The C calls alone, on a pool of their own. */
  static final class Floor {
    final MethodHandle tryAcquire;
    final MethodHandle release;
    final MethodHandle destroy;
    final long pool;

    Floor() throws Throwable {
      Linker l = Linker.nativeLinker();
      SymbolLookup lib = SymbolLookup.libraryLookup(Path.of(BufferPool.libraryPath()), Arena.global());
      MethodHandle create = l.downcallHandle(lib.find("bufpool_create").get(),
          FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG));
      tryAcquire = l.downcallHandle(lib.find("bufpool_try_acquire").get(),
          FunctionDescriptor.of(JAVA_LONG, JAVA_LONG), Linker.Option.critical(false));
      release = l.downcallHandle(lib.find("bufpool_release").get(),
          FunctionDescriptor.ofVoid(JAVA_LONG, JAVA_LONG), Linker.Option.critical(false));
      destroy = l.downcallHandle(lib.find("bufpool_destroy").get(),
          FunctionDescriptor.ofVoid(JAVA_LONG));
      pool = (long) create.invokeExact(0L, 0L);
    }

    long pairs(int n) {
      long s = 0;
      try {
        for (int i = 0; i < n; i++) {
          long p = (long) tryAcquire.invokeExact(pool);
          MemorySegment.ofAddress(p).reinterpret(4096).set(JAVA_BYTE, 0, (byte) i);
          s += p;
          release.invokeExact(pool, p);
        }
      } catch (Throwable t) {
        throw new RuntimeException(t);
      }
      return s;
    }

    void close() throws Throwable {
      destroy.invokeExact(pool);
    }
  }
}
