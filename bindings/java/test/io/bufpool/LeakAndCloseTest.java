package io.bufpool;

import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Forgotten buffers (the Cleaner) and pools closed with buffers out. */
@Timeout(60)
class LeakAndCloseTest {
  private static void forgetOne(BufferPool pool) {
    pool.acquire().segment().set(JAVA_LONG, 0, 1);  // never released
  }

  @Test
  void forgottenBufferComesBackThroughTheCleanerWithAReportLine() throws Exception {
    try (BufferPool pool = BufferPool.create(BufferPool.options().bufferCount(4)
        .hugePages(BufferPool.HugePages.NEVER).name("leaky")
        .leakDetection(BufferPool.LeakDetection.ALL))) {
      forgetOne(pool);
      assertEquals(1, pool.stats().inUse());
      long deadline = System.nanoTime() + 20_000_000_000L;
      while (pool.stats().leaks() == 0 && System.nanoTime() < deadline) {
        System.gc();
        Thread.sleep(10);
      }
      BufferPool.Stats s = pool.stats();
      assertEquals(1, s.leaks());
      assertEquals(0, s.inUse(), "the leaked buffer is back");
      String r = pool.holdersReport();
      assertTrue(r.contains("LEAK: PooledBuffer[slot"), r);
      assertTrue(r.contains("of pool \"leaky\"] became unreachable without close()"), r);
      assertTrue(r.contains("forgetOne"), "names the acquiring frame: " + r);
      assertTrue(r.contains("1 leak(s) found"), r);
    }
  }

  @Test
  void releasedTrackedBuffersAreNotLeaks() throws Exception {
    try (BufferPool pool = BufferPool.create(BufferPool.options().bufferCount(8)
        .hugePages(BufferPool.HugePages.NEVER).leakDetection(BufferPool.LeakDetection.ALL))) {
      for (int i = 0; i < 1000; i++) {
        pool.acquire().close();
      }
      System.gc();
      Thread.sleep(100);
      assertEquals(0, pool.stats().leaks());
      assertEquals(0, pool.stats().inUse());
    }
  }

  @Test
  void closeWithBuffersOutNamesThemAndFreesTheRegionAfterTheLast() {
    BufferPool pool = BufferPool.create(BufferPool.options().bufferCount(8)
        .hugePages(BufferPool.HugePages.NEVER).name("early")
        .leakDetection(BufferPool.LeakDetection.ALL));
    PooledBuffer a = pool.acquire();
    PooledBuffer b = pool.acquire();
    pool.acquire().close();
    ByteBuffer view = a.byteBuffer();
    MemorySegment seg = b.segment();
    IllegalStateException e = assertThrows(IllegalStateException.class, pool::close);
    String m = e.getMessage();
    assertTrue(m.contains("2 buffer(s) still out (slots " + Math.min(a.slot, b.slot) + ", "
        + Math.max(a.slot, b.slot) + ")"), m);
    assertTrue(m.contains("closeWithBuffersOutNamesThemAndFreesTheRegionAfterTheLast"), m);
    pool.close();  // again: nothing
    // The pool refuses new work and every view; nothing crashes.
    assertThrows(IllegalStateException.class, pool::tryAcquire);
    assertThrows(IllegalStateException.class, () -> pool.acquireBulk(1));
    assertThrows(IllegalStateException.class, a::segment);
    assertThrows(IllegalStateException.class, () -> view.getLong(0));
    assertThrows(IllegalStateException.class, () -> seg.get(JAVA_LONG, 0));
    a.close();
    assertTrue(pool.holdersReport().contains("1 buffer(s) out"), pool.holdersReport());
    b.close();
    assertTrue(pool.holdersReport().contains("the library's pool is destroyed"),
        pool.holdersReport());
    b.close();
  }

  @Test
  void closeWithNothingOutFreesAtOnce() {
    BufferPool pool = BufferPoolTest.small(4);
    pool.acquire().close();
    pool.close();
    assertTrue(pool.holdersReport().contains("destroyed"));
    assertEquals(0, pool.stats().inUse());
  }
}
