package io.bufpool;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.Random;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/** io.bufpool.Files.copy against java.nio.file.Files on the same inputs. */
@Timeout(60)
class FilesTest {
  @TempDir
  Path dir;

  private Path file(String name, int size) throws IOException {
    byte[] data = new byte[size];
    new Random(size).nextBytes(data);
    return java.nio.file.Files.write(dir.resolve(name), data);
  }

  @Test
  void everyMethodCopiesEverySizeByteForByte() throws IOException {
    int batch = Files.BATCH * 4096;
    int[] sizes = {0, 1, 4095, 4096, 4097, batch - 1, batch, batch + 1, 3 * batch + 17,
                   5_000_000};
    try (BufferPool pool = BufferPoolTest.small(Files.BATCH + 4)) {
      for (int size : sizes) {
        Path src = file("src" + size, size);
        for (Files.Method m : Files.Method.values()) {
          for (BufferPool p : new BufferPool[] {pool, null}) {
            Path dst = dir.resolve("dst" + size + m + (p == null));
            long n = p == null ? Files.copy(src, dst, m) : Files.copy(p, src, dst, m);
            assertEquals(size, n, m + " " + size);
            assertArrayEquals(java.nio.file.Files.readAllBytes(src),
                java.nio.file.Files.readAllBytes(dst), m + " " + size);
          }
        }
      }
      assertEquals(0, pool.stats().inUse());
      assertTrue(pool.stats().highWater() <= Files.BATCH + 4);
    }
  }

  @Test
  void aPoolOfOneBufferIsEnough() throws IOException {
    try (BufferPool pool = BufferPoolTest.small(1)) {
      Path src = file("src", 100_000);
      Path dst = dir.resolve("dst");
      assertEquals(100_000, Files.copy(pool, src, dst, Files.Method.READ_WRITE));
      assertArrayEquals(java.nio.file.Files.readAllBytes(src), java.nio.file.Files.readAllBytes(dst));
    }
  }

  @Test
  void behavesAsJavaNioFilesCopyOnAnExistingTarget() throws IOException {
    Path src = file("src", 10_000);
    Path dst = file("dst", 50_000);
    for (Files.Method m : Files.Method.values()) {
      assertThrows(FileAlreadyExistsException.class, () -> Files.copy(src, dst, m));
      assertThrows(FileAlreadyExistsException.class, () -> java.nio.file.Files.copy(src, dst));
      assertEquals(10_000, Files.copy(src, dst, m, StandardCopyOption.REPLACE_EXISTING));
      assertArrayEquals(java.nio.file.Files.readAllBytes(src), java.nio.file.Files.readAllBytes(dst));
      assertEquals(0, Files.copy(src, src, m), "onto itself: nothing");
      assertEquals(10_000, java.nio.file.Files.size(src));
    }
    assertThrows(UnsupportedOperationException.class,
        () -> Files.copy(src, dir.resolve("x"), Files.Method.READ_WRITE,
            StandardCopyOption.ATOMIC_MOVE));
    assertThrows(java.nio.file.NoSuchFileException.class,
        () -> Files.copy(dir.resolve("missing"), dir.resolve("y"), Files.Method.TRANSFER_TO));
  }
}
