// The seed experiment (SeedExperiment.java) through the Java binding: in a
// fresh JVM, obtain 10,000 buffers of 4096 bytes from a BufferPool and
// write each once. Prints two JSON lines, the same shape as SeedExperiment's:
//   java_bufpool_<mode>              the buffers from a pool made before the
//                                    clock started, as a server makes its
//                                    pool at start-up: created, and one
//                                    buffer taken, written and released the
//                                    same way (which links the calls)
//   java_bufpool_<mode>_with_create  all of it timed: loading the library,
//                                    linking the calls (the FFM API's
//                                    first downcalls cost milliseconds
//                                    each in a new JVM), mapping and
//                                    faulting in 40 MiB
// mode bulk: one acquireBulk(count); each: count acquire() calls.
//
//   java --enable-native-access=ALL-UNNAMED -cp bufpool.jar:. SeedPool bulk|each [count]
import static java.lang.foreign.ValueLayout.JAVA_BYTE;

import io.bufpool.BufferPool;
import io.bufpool.PooledBuffer;

public final class SeedPool {
  public static void main(String[] args) {
    if (args.length < 1 || !(args[0].equals("bulk") || args[0].equals("each"))) {
      System.err.println("usage: SeedPool bulk|each [count]");
      System.exit(2);
    }
    final int count = args.length > 1 ? Integer.parseInt(args[1]) : 10000;
    long t0 = System.nanoTime();
    BufferPool pool = BufferPool.create(BufferPool.options().bufferSize(4096).bufferCount(count));
    PooledBuffer[] first = args[0].equals("bulk") ? pool.acquireBulk(1)
        : new PooledBuffer[] {pool.acquire()};
    first[0].segment().set(JAVA_BYTE, 0, (byte) 1);
    pool.releaseAll(first);
    long t1 = System.nanoTime();
    PooledBuffer[] buffers;
    if (args[0].equals("bulk")) {
      buffers = pool.acquireBulk(count);
    } else {
      buffers = new PooledBuffer[count];
      for (int i = 0; i < count; i++) {
        buffers[i] = pool.acquire();
      }
    }
    for (PooledBuffer b : buffers) {
      b.segment().set(JAVA_BYTE, 0, (byte) 1);
    }
    long t2 = System.nanoTime();
    int check = 0;
    for (PooledBuffer b : buffers) {
      check += b.segment().get(JAVA_BYTE, 0);
    }
    pool.releaseAll(buffers);
    pool.close();
    System.out.printf("{\"contender\": \"java_bufpool_%s\", \"count\": %d, \"ms\": %.4f, \"check\": %d}%n",
        args[0], count, (t2 - t1) / 1e6, check);
    System.out.printf("{\"contender\": \"java_bufpool_%s_with_create\", \"count\": %d, \"ms\": %.4f, \"check\": %d}%n",
        args[0], count, (t2 - t0) / 1e6, check);
  }
}
