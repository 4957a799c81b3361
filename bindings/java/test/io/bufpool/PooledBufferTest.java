package io.bufpool;

import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.foreign.MemorySegment;
import java.nio.ByteBuffer;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.function.Consumer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** A buffer's lifetime: exactly one release, refused accessors, stale views. */
@Timeout(60)
class PooledBufferTest {
  @Test
  void releasedBufferRefusesEveryAccessorNamingIt() {
    try (BufferPool pool = BufferPoolTest.small(2)) {
      PooledBuffer b = pool.acquire();
      int slot = b.slot();
      b.close();
      assertTrue(b.isReleased());
      List<Consumer<PooledBuffer>> accessors = List.of(PooledBuffer::segment,
          PooledBuffer::byteBuffer, PooledBuffer::address, PooledBuffer::size,
          PooledBuffer::slot);
      for (Consumer<PooledBuffer> a : accessors) {
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> a.accept(b));
        assertTrue(e.getMessage().contains("PooledBuffer[slot " + slot + " of pool \"test\""),
            e.getMessage());
        assertTrue(e.getMessage().contains("released"), e.getMessage());
      }
      assertEquals(pool, b.pool());
    }
  }

  @Test
  void secondReleaseIsHarmless() {
    try (BufferPool pool = BufferPoolTest.small(2)) {
      PooledBuffer a = pool.acquire();
      PooledBuffer b = pool.acquire();
      a.close();
      a.close();
      a.release();
      assertEquals(1, pool.stats().inUse(), "b is still out");
      PooledBuffer c = pool.acquire();  // a's slot, owned by c now
      a.close();  // must not release c's slot
      assertEquals(2, pool.stats().inUse());
      c.segment().set(JAVA_LONG, 0, 7);
      pool.releaseAll(b, c);
      assertEquals(0, pool.stats().inUse());
    }
  }

  @Test
  void racingReleasesReachThePoolOnce() throws Exception {
    try (BufferPool pool = BufferPoolTest.small(64)) {
      for (int round = 0; round < 200; round++) {
        PooledBuffer b = pool.acquire();
        CountDownLatch go = new CountDownLatch(1);
        Thread[] ts = new Thread[4];
        for (int i = 0; i < ts.length; i++) {
          ts[i] = Thread.ofPlatform().start(() -> {
            try {
              go.await();
            } catch (InterruptedException e) {
              return;
            }
            b.close();
          });
        }
        go.countDown();
        for (Thread t : ts) {
          t.join();
        }
        assertEquals(0, pool.stats().inUse());
      }
    }
  }

  @Test
  void staleViewReachesTheNextOwnerWithoutTheCheck() {
    // The hazard the docs name: a pool of one buffer, no cache, so the next
    // acquire gets the same slot.
    try (BufferPool pool = BufferPool.create(BufferPool.options().bufferCount(1).cacheSize(0)
        .hugePages(BufferPool.HugePages.NEVER).checkUseAfterRelease(false))) {
      PooledBuffer first = pool.acquire();
      ByteBuffer stale = first.byteBuffer();
      first.close();
      PooledBuffer second = pool.acquire();
      second.segment().set(JAVA_LONG, 0, 0);
      stale.putLong(0, 0x5EED);
      assertEquals(0x5EED, second.byteBuffer().getLong(0), "the stale write landed");
      second.close();
    }
  }

  @Test
  void checkUseAfterReleaseMakesAStaleViewThrow() {
    try (BufferPool pool = BufferPool.create(BufferPool.options().bufferCount(1).cacheSize(0)
        .hugePages(BufferPool.HugePages.NEVER).checkUseAfterRelease(true))) {
      PooledBuffer first = pool.acquire();
      ByteBuffer staleBuffer = first.byteBuffer();
      MemorySegment staleSegment = first.segment();
      staleBuffer.putLong(0, 1);
      first.close();
      PooledBuffer second = pool.acquire();
      second.segment().set(JAVA_LONG, 0, 99);
      assertThrows(IllegalStateException.class, () -> staleBuffer.putLong(0, 0x5EED));
      assertThrows(IllegalStateException.class, () -> staleBuffer.getLong(0));
      assertThrows(IllegalStateException.class, () -> staleSegment.set(JAVA_LONG, 0, 1));
      assertEquals(99, second.segment().get(JAVA_LONG, 0), "the next owner's bytes");
      second.close();
    }
  }

  @Test
  void scrubOnReleaseZeroesTheBuffer() {
    try (BufferPool pool = BufferPool.create(BufferPool.options().bufferCount(1).cacheSize(0)
        .hugePages(BufferPool.HugePages.NEVER).scrubOnRelease(true))) {
      PooledBuffer b = pool.acquire();
      MemorySegment stale = b.segment();
      stale.set(JAVA_LONG, 8, -1);
      b.close();
      assertEquals(0, stale.get(JAVA_LONG, 8), "a stale read sees zeros");
      try (PooledBuffer again = pool.acquire()) {
        assertEquals(0, again.segment().get(JAVA_LONG, 8));
      }
    }
  }

  @Test
  void toStringNamesTheBufferAndItsState() {
    try (BufferPool pool = BufferPoolTest.small(1)) {
      PooledBuffer b = pool.acquire();
      assertEquals("PooledBuffer[slot 0 of pool \"test\"]", b.toString());
      assertFalse(b.isReleased());
      b.close();
      assertEquals("PooledBuffer[slot 0 of pool \"test\", released]", b.toString());
    }
  }
}
