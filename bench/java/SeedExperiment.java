// The seed experiment this project comes from, in Java, timed like
// bench/cold_start.cc: in a fresh JVM, obtain 10,000 direct buffers of
// 4096 bytes and write each once, either one allocateDirect per buffer or one
// allocateDirect of 10,000 x 4096 sliced into 10,000 with slice().
// Prints one JSON line. Usage: java SeedExperiment direct|sliced [count]
import java.nio.ByteBuffer;

public final class SeedExperiment {
  public static void main(String[] args) {
    if (args.length < 1 || !(args[0].equals("direct") || args[0].equals("sliced"))) {
      System.err.println("usage: SeedExperiment direct|sliced [count]");
      System.exit(2);
    }
    final int count = args.length > 1 ? Integer.parseInt(args[1]) : 10000;
    final int size = 4096;
    ByteBuffer[] buffers = new ByteBuffer[count];
    long start = System.nanoTime();
    if (args[0].equals("direct")) {
      for (int i = 0; i < count; i++) {
        buffers[i] = ByteBuffer.allocateDirect(size);
        buffers[i].put(0, (byte) 1);
      }
    } else {
      ByteBuffer big = ByteBuffer.allocateDirect(count * size);
      for (int i = 0; i < count; i++) {
        big.limit((i + 1) * size).position(i * size);
        buffers[i] = big.slice();
        buffers[i].put(0, (byte) 1);
      }
    }
    long end = System.nanoTime();
    int check = 0;
    for (ByteBuffer b : buffers) check += b.get(0);
    System.out.printf("{\"contender\": \"java_%s\", \"count\": %d, \"ms\": %.4f, \"check\": %d}%n",
        args[0].equals("direct") ? "allocateDirect_each" : "allocateDirect_sliced",
        count, (end - start) / 1e6, check);
  }
}
