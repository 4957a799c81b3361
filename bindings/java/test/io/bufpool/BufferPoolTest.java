package io.bufpool;

import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.HashSet;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Creating pools, acquiring and releasing, bulk, waits and the reports. */
@Timeout(60)
class BufferPoolTest {
  static BufferPool small(int count) {
    return BufferPool.create(BufferPool.options().bufferSize(4096).bufferCount(count)
        .hugePages(BufferPool.HugePages.NEVER).name("test"));
  }

  @Test
  void buffersAreDistinctAlignedSlicesOfTheRegion() {
    try (BufferPool pool = small(16)) {
      PooledBuffer[] all = new PooledBuffer[16];
      Set<Long> seen = new HashSet<>();
      MemorySegment region = pool.region();
      for (int i = 0; i < 16; i++) {
        all[i] = pool.acquire();
        MemorySegment s = all[i].segment();
        assertEquals(4096, s.byteSize());
        assertEquals(0, s.address() % 4096, "page-aligned");
        assertTrue(s.address() >= region.address()
            && s.address() + 4096 <= region.address() + region.byteSize(), "inside the region");
        assertEquals(region.address() + (long) all[i].slot() * 4096, s.address());
        assertTrue(seen.add(s.address()), "distinct");
        s.set(JAVA_LONG, 0, i);
      }
      for (int i = 0; i < 16; i++) {
        assertEquals(i, all[i].byteBuffer().order(java.nio.ByteOrder.nativeOrder()).getLong(0));
      }
      assertEquals(16, pool.stats().inUse());
      pool.releaseAll(all);
      assertEquals(0, pool.stats().inUse());
    }
  }

  @Test
  void byteBufferIsAFreshDirectViewEachCall() {
    try (BufferPool pool = small(2); PooledBuffer b = pool.acquire()) {
      ByteBuffer v1 = b.byteBuffer();
      v1.position(100);
      ByteBuffer v2 = b.byteBuffer();
      assertTrue(v2.isDirect());
      assertEquals(0, v2.position());
      assertEquals(4096, v2.limit());
      v1.putLong(0, 42);
      assertEquals(42, v2.getLong(0));
    }
  }

  @Test
  void badOptionsNameTheField() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> BufferPool.create(BufferPool.options().bufferSize(100)));
    assertTrue(e.getMessage().contains("buffer_size") && e.getMessage().contains("100"),
        e.getMessage());
    e = assertThrows(IllegalArgumentException.class,
        () -> BufferPool.create(BufferPool.options().leakSampleEvery(0)));
    assertTrue(e.getMessage().contains("leakSampleEvery"), e.getMessage());
  }

  @Test
  void tryAcquireReturnsNullWhenEveryBufferIsOut() {
    try (BufferPool pool = small(4)) {
      PooledBuffer[] all = {pool.tryAcquire(), pool.tryAcquire(), pool.tryAcquire(),
                            pool.tryAcquire()};
      for (PooledBuffer b : all) {
        assertNotNull(b);
      }
      assertNull(pool.tryAcquire());
      assertEquals(1, pool.stats().acquireFailures());
      all[2].close();
      PooledBuffer again = pool.tryAcquire();
      assertNotNull(again);
      again.close();
      pool.releaseAll(all);
    }
  }

  @Test
  void acquireWithTimeoutThrowsAndIsCounted() {
    try (BufferPool pool = small(1)) {
      PooledBuffer held = pool.acquire();
      long t0 = System.nanoTime();
      BufferPool.AcquireTimeoutException e = assertThrows(BufferPool.AcquireTimeoutException.class,
          () -> pool.acquire(Duration.ofMillis(50)));
      assertTrue(System.nanoTime() - t0 >= 40_000_000L, "waited");
      assertTrue(e.getMessage().contains("DEADLINE_EXCEEDED"), e.getMessage());
      assertThrows(BufferPool.AcquireTimeoutException.class, () -> pool.acquire(Duration.ZERO));
      BufferPool.Stats s = pool.stats();
      assertEquals(1, s.acquireTimeouts());
      assertEquals(1, s.acquireFailures(), "the zero timeout's try; a wait's own are not");
      held.close();
    }
  }

  @Test
  void acquireWaitsForAReleaseOnAnotherThread() throws Exception {
    for (boolean virtual : new boolean[] {false, true}) {
      try (BufferPool pool = small(1)) {
        PooledBuffer held = pool.acquire();
        CountDownLatch waiting = new CountDownLatch(1);
        PooledBuffer[] got = new PooledBuffer[1];
        Runnable waiter = () -> {
          waiting.countDown();
          got[0] = pool.acquire(Duration.ofSeconds(30));
        };
        Thread t = virtual ? Thread.ofVirtual().start(waiter) : Thread.ofPlatform().start(waiter);
        waiting.await();
        Thread.sleep(20);
        int slot = held.slot();
        held.close();
        t.join();
        assertEquals(slot, got[0].slot(), virtual ? "virtual" : "platform");
        got[0].close();
        assertEquals(0, pool.stats().acquireTimeouts());
      }
    }
  }

  @Test
  void virtualWaitIsInterruptible() throws Exception {
    try (BufferPool pool = small(1)) {
      PooledBuffer held = pool.acquire();
      Throwable[] thrown = new Throwable[1];
      Thread t = Thread.ofVirtual().start(() -> {
        try {
          pool.acquire().close();
        } catch (Throwable e) {
          thrown[0] = e;
        }
      });
      Thread.sleep(20);
      t.interrupt();
      t.join();
      assertTrue(thrown[0] instanceof java.util.concurrent.CancellationException,
          String.valueOf(thrown[0]));
      held.close();
    }
  }

  @Test
  void acquireBulkIsAllOrNothing() {
    try (BufferPool pool = small(8)) {
      PooledBuffer[] five = pool.acquireBulk(5);
      assertEquals(5, five.length);
      assertEquals(5, pool.stats().inUse());
      assertNull(pool.acquireBulk(5), "only 3 free");
      assertEquals(5, pool.stats().inUse(), "nothing taken");
      assertEquals(1, pool.stats().acquireFailures());
      PooledBuffer[] three = pool.acquireBulk(3);
      assertNotNull(three);
      assertNull(pool.tryAcquire());
      assertEquals(0, pool.acquireBulk(0).length);
      five[1].close();  // released alone; releaseAll skips it
      pool.releaseAll(five);
      pool.releaseAll(three);
      pool.releaseAll(three);  // again: nothing
      assertEquals(0, pool.stats().inUse());
      for (PooledBuffer b : five) {
        assertTrue(b.isReleased());
      }
    }
  }

  @Test
  void releaseAllRefusesAnotherPoolsBufferAndReleasesNone() {
    try (BufferPool a = small(2); BufferPool b = small(2)) {
      PooledBuffer mine = a.acquire();
      PooledBuffer theirs = b.acquire();
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
          () -> a.releaseAll(mine, theirs));
      assertTrue(e.getMessage().contains("not from this pool"), e.getMessage());
      assertEquals(1, a.stats().inUse());
      assertEquals(1, b.stats().inUse());
      mine.close();
      theirs.close();
    }
  }

  @Test
  void holdersReportNamesWhatIsOut() {
    try (BufferPool pool = BufferPool.create(BufferPool.options().bufferCount(4)
        .hugePages(BufferPool.HugePages.NEVER).name("rep")
        .leakDetection(BufferPool.LeakDetection.ALL))) {
      PooledBuffer b = pool.acquire();
      String r = pool.holdersReport();
      assertTrue(r.contains("1 of 4 buffer(s) out"), r);
      assertTrue(r.contains("pool \"rep\": 1 buffer(s) out (slots " + b.slot() + ")"), r);
      assertTrue(r.contains("holdersReportNamesWhatIsOut"), "the acquiring frame: " + r);
      b.close();
      assertTrue(pool.holdersReport().contains("0 buffer(s) out"));
      assertTrue(pool.metrics().contains("pool=\"rep\""), pool.metrics());
    }
  }

  @Test
  void statsFollowTheLibrary() {
    try (BufferPool pool = small(8)) {
      PooledBuffer[] b = pool.acquireBulk(6);
      BufferPool.Stats s = pool.stats();
      assertEquals(8, s.capacity());
      assertEquals(6, s.inUse());
      assertTrue(s.highWater() >= 6);
      pool.releaseAll(b);
      assertEquals(0, pool.stats().inUse());
      assertArrayEquals(new long[] {8, 8}, new long[] {pool.capacity(), s.committed()});
    }
  }

  @Test
  void elasticPoolGrowsOnDemand() {
    try (BufferPool pool = BufferPool.create(BufferPool.options().bufferCount(4)
        .maxBufferCount(64).growStep(4).hugePages(BufferPool.HugePages.NEVER))) {
      PooledBuffer[] b = pool.acquireBulk(20);
      assertNotNull(b);
      assertTrue(pool.stats().grows() >= 1);
      for (PooledBuffer x : b) {
        x.segment().set(JAVA_LONG, 4088, x.slot());
      }
      pool.releaseAll(b);
    }
  }

  @Test
  void libraryPathIsReported() {
    assertTrue(BufferPool.libraryPath().contains("libbufpool"), BufferPool.libraryPath());
  }
}
