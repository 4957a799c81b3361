// Run by java_installed_jar with only the installed bufpool.jar on the class
// path: acquires, writes and releases a buffer, and prints where the
// library came from, which must be under the prefix given as args[0].
import io.bufpool.BufferPool;
import io.bufpool.PooledBuffer;

public final class InstalledJar {
  public static void main(String[] args) {
    try (BufferPool pool = BufferPool.create(BufferPool.options().bufferCount(8));
         PooledBuffer b = pool.acquire()) {
      b.byteBuffer().putLong(0, 42);
      if (b.byteBuffer().getLong(0) != 42) {
        throw new AssertionError("the write did not land");
      }
    }
    System.out.println("loaded " + BufferPool.libraryPath());
    if (!BufferPool.libraryPath().startsWith(args[0] + "/")) {
      throw new AssertionError("not the installed library: " + BufferPool.libraryPath());
    }
  }
}
