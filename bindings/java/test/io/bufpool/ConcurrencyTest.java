package io.bufpool;

import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Many threads, platform and virtual: each buffer has one owner at a time
 * (a pattern written into it survives until its release), and every buffer
 * comes back.
 */
@Timeout(120)
class ConcurrencyTest {
  /** Acquires, writes a pattern, yields, checks it, releases; n times. */
  static void churn(BufferPool pool, long id, int n, AtomicReference<String> error) {
    for (int i = 0; i < n && error.get() == null; i++) {
      PooledBuffer[] held = i % 7 == 0 ? pool.acquireBulk(3) : new PooledBuffer[] {pool.acquire()};
      if (held == null) {
        held = new PooledBuffer[] {pool.acquire()};
      }
      long stamp = (id << 32) | i;
      for (PooledBuffer b : held) {
        MemorySegment s = b.segment();
        s.set(JAVA_LONG, 0, stamp);
        s.set(JAVA_LONG, s.byteSize() - 8, ~stamp);
      }
      Thread.yield();
      for (PooledBuffer b : held) {
        MemorySegment s = b.segment();
        if (s.get(JAVA_LONG, 0) != stamp || s.get(JAVA_LONG, s.byteSize() - 8) != ~stamp) {
          error.compareAndSet(null, b + " had two owners at once (thread " + id + ", step " + i
              + ")");
        }
      }
      if (held.length > 1) {
        pool.releaseAll(held);
      } else {
        held[0].close();
      }
    }
  }

  void run(ExecutorService exec, int tasks, int poolSize, int n) throws Exception {
    AtomicReference<String> error = new AtomicReference<>();
    try (BufferPool pool = BufferPool.create(BufferPool.options().bufferCount(poolSize)
        .hugePages(BufferPool.HugePages.NEVER).name("churn"))) {
      List<Future<?>> fs = new ArrayList<>();
      for (int t = 0; t < tasks; t++) {
        long id = t;
        fs.add(exec.submit(() -> churn(pool, id, n, error)));
      }
      for (Future<?> f : fs) {
        f.get();
      }
      assertNull(error.get());
      assertEquals(0, pool.stats().inUse());
      assertEquals(0, pool.stats().acquireTimeouts());
    }
  }

  @Test
  void platformThreadsShareAPoolSmallerThanTheirDemand() throws Exception {
    try (ExecutorService exec = Executors.newFixedThreadPool(16)) {
      run(exec, 16, 24, 3000);
    }
  }

  @Test
  void tenThousandVirtualThreadsWaitForSixteenBuffers() throws Exception {
    try (ExecutorService exec = Executors.newVirtualThreadPerTaskExecutor()) {
      run(exec, 10_000, 16, 20);
    }
  }

  @Test
  void buffersHandedBetweenThreadsComeBackOnce() throws Exception {
    try (BufferPool pool = BufferPoolTest.small(32)) {
      BlockingQueue<PooledBuffer> q = new ArrayBlockingQueue<>(8);
      int n = 20_000;
      Thread producer = Thread.ofPlatform().start(() -> {
        for (int i = 0; i < n; i++) {
          PooledBuffer b = pool.acquire();
          b.segment().set(JAVA_LONG, 0, i);
          try {
            q.put(b);
          } catch (InterruptedException e) {
            return;
          }
        }
      });
      Thread consumer = Thread.ofVirtual().start(() -> {
        for (int i = 0; i < n; i++) {
          try {
            PooledBuffer b = q.take();
            if (b.segment().get(JAVA_LONG, 0) != i) {
              throw new AssertionError("out of order at " + i);
            }
            b.close();
            b.close();
          } catch (InterruptedException e) {
            return;
          }
        }
      });
      producer.join();
      consumer.join();
      assertEquals(0, pool.stats().inUse());
    }
  }
}
