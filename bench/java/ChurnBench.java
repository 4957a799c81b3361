// Resident memory under churn: 8 threads (by default) acquire 1 to 8
// buffers at a time from one pool, write every byte's first and last word,
// sometimes hand them to another thread's queue to release, and release;
// for SECONDS. Samples VmRSS (/proc/self/status) every second after a
// 5-second warm-up and prints one JSON line:
// {"workload": "churn", "contender": "java_bufpool_churn", "threads",
//  "seconds", "pairs", "region_mib", "rss_start_mib", "rss_end_mib",
//  "rss_max_mib", "rss_growth_mib", "leaks", "rss_every_10s_mib"}: growth is
// end minus start. With -XX:NativeMemoryTracking=summary -Dchurn.nmt=true
// it also prints on stderr the JVM's native memory by category, as a diff
// against the start (where any growth went).
//
//   java --enable-native-access=ALL-UNNAMED -Xms128m -Xmx128m -XX:+AlwaysPreTouch \
//        -cp bufpool.jar:. ChurnBench [seconds] [threads]
//
// A fixed, pre-touched heap: otherwise the collector grows the heap towards
// -Xmx under the churn's garbage (the PooledBuffer objects), and VmRSS
// measures that rather than the pool (measured: 80 -> 240 MiB in 2 minutes
// with -Xmx256m alone).
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import io.bufpool.BufferPool;
import io.bufpool.PooledBuffer;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.LongAdder;
import javax.management.ObjectName;

public final class ChurnBench {
  static double rssMib() throws IOException {
    for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
      if (line.startsWith("VmRSS:")) {
        return Long.parseLong(line.replaceAll("[^0-9]", "")) / 1024.0;
      }
    }
    throw new IOException("no VmRSS in /proc/self/status");
  }

  /** A jcmd VM.native_memory command, run in this JVM (-XX:NativeMemoryTracking). */
  static String nativeMemory(String command) throws Exception {
    return (String) ManagementFactory.getPlatformMBeanServer().invoke(
        new ObjectName("com.sun.management:type=DiagnosticCommand"), "vmNativeMemory",
        new Object[] {new String[] {command}}, new String[] {String[].class.getName()});
  }

  public static void main(String[] args) throws Exception {
    int seconds = args.length > 0 ? Integer.parseInt(args[0]) : 120;
    int threads = args.length > 1 ? Integer.parseInt(args[1]) : 8;
    BufferPool pool = BufferPool.create(BufferPool.options().bufferSize(4096).bufferCount(4096)
        .name("churn"));
    AtomicBoolean stop = new AtomicBoolean();
    LongAdder pairs = new LongAdder();
    List<ConcurrentLinkedQueue<PooledBuffer>> handoff = new ArrayList<>();
    for (int t = 0; t < threads; t++) {
      handoff.add(new ConcurrentLinkedQueue<>());
    }
    List<Thread> ts = new ArrayList<>();
    for (int t = 0; t < threads; t++) {
      int me = t;
      ts.add(Thread.ofPlatform().start(() -> {
        ThreadLocalRandom rnd = ThreadLocalRandom.current();
        long local = 0;
        while (!stop.get()) {
          PooledBuffer b;
          while ((b = handoff.get(me).poll()) != null) {
            b.close();
          }
          int n = 1 + rnd.nextInt(8);
          PooledBuffer[] held = n == 1 ? new PooledBuffer[] {pool.acquire()} : pool.acquireBulk(n);
          if (held == null) {
            continue;
          }
          for (PooledBuffer x : held) {
            MemorySegment s = x.segment();
            s.set(JAVA_LONG, 0, local);
            s.set(JAVA_LONG, s.byteSize() - 8, local);
          }
          if (rnd.nextInt(16) == 0) {
            handoff.get(rnd.nextInt(threads)).add(held[0]);
            held[0] = null;
          }
          pool.releaseAll(held);
          local += n;
        }
        pairs.add(local);
      }));
    }
    Thread.sleep(5000);
    boolean nmt = Boolean.getBoolean("churn.nmt");
    if (nmt) {
      nativeMemory("baseline");
    }
    double start = rssMib();
    double max = start;
    double end = start;
    StringBuilder series = new StringBuilder();
    for (int s = 0; s < seconds; s++) {
      Thread.sleep(1000);
      end = rssMib();
      max = Math.max(max, end);
      if (s % 10 == 9) {
        series.append(series.length() == 0 ? "" : ", ").append(String.format("%.1f", end));
      }
    }
    if (nmt) {
      System.err.println(nativeMemory("summary.diff"));
    }
    stop.set(true);
    for (Thread t : ts) {
      t.join();
    }
    for (ConcurrentLinkedQueue<PooledBuffer> q : handoff) {
      PooledBuffer b;
      while ((b = q.poll()) != null) {
        b.close();
      }
    }
    BufferPool.Stats st = pool.stats();
    pool.close();
    System.out.printf("{\"workload\": \"churn\", \"contender\": \"java_bufpool_churn\", "
        + "\"threads\": %d, \"seconds\": %d, \"pairs\": %d, \"region_mib\": %.1f, "
        + "\"rss_start_mib\": %.1f, \"rss_end_mib\": %.1f, \"rss_max_mib\": %.1f, "
        + "\"rss_growth_mib\": %.1f, \"leaks\": %d, \"rss_every_10s_mib\": [%s]}%n",
        threads, seconds, pairs.sum(), 4096 * 4096 / 1048576.0, start, end, max, end - start,
        st.leaks(), series);
  }
}
