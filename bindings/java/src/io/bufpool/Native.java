package io.bufpool;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import java.io.IOException;
import java.io.InputStream;
import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.invoke.MethodHandle;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.CodeSource;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

/**
 * The C API's functions (bufpool/c.h) as method handles, and where the
 * library was found.
 *
 * <p>Which library: the system property {@code bufpool.library} (a path)
 * when set; else the installed library that the build recorded in
 * {@code native.properties}: first relative to the folder of the jar this
 * class came from (an install that was moved still works), then the absolute
 * install libdir; else the library's name through the dynamic loader's own
 * search (ld.so.cache, LD_LIBRARY_PATH). A failure names every place tried.
 *
 * <p>Pointers pass as 64-bit integers ({@code JAVA_LONG}) in the calls made
 * per buffer: on the LP64 ABIs this binding builds for (checked by the
 * build) a pointer and a 64-bit integer travel in the same registers, and a
 * {@code long} return needs no {@code MemorySegment} object. Calls that
 * never block and run for nanoseconds use {@code Linker.Option.critical}:
 * no thread-state transition; the bulk calls also take heap arrays
 * directly. Calls that may block (acquire with a wait) or take
 * milliseconds (create, destroy, reports) are ordinary downcalls.
 */
final class Native {
  private Native() {}

  /** The library's path, or its name when the dynamic loader found it. */
  static final String LIBRARY;

  private static final SymbolLookup LOOKUP;
  private static final Linker LINKER = Linker.nativeLinker();

  static {
    if (ADDRESS.byteSize() != 8) {
      throw new UnsupportedOperationException(
          "io.bufpool: needs a 64-bit JVM (pointers are passed as longs)");
    }
    List<String> tried = new ArrayList<>();
    SymbolLookup found = null;
    String where = null;
    for (String candidate : candidates(tried)) {
      try {
        found = candidate.contains("/")
            ? SymbolLookup.libraryLookup(Path.of(candidate), Arena.global())
            : SymbolLookup.libraryLookup(candidate, Arena.global());
        where = candidate;
        break;
      } catch (IllegalArgumentException e) {
        tried.add(candidate + " (" + e.getMessage() + ")");
      }
    }
    if (found == null) {
      throw new UnsatisfiedLinkError(
          "io.bufpool: cannot load libbufpool; tried " + String.join(", ", tried)
              + ". Set -Dbufpool.library=/path/to/libbufpool_java.so");
    }
    LOOKUP = found;
    LIBRARY = where;
  }

  /** The places to try, in order; a set system property is the only one. */
  private static List<String> candidates(List<String> tried) {
    List<String> out = new ArrayList<>();
    String forced = System.getProperty("bufpool.library");
    if (forced != null && !forced.isEmpty()) {
      out.add(forced);
      return out;
    }
    Properties p = new Properties();
    try (InputStream in = Native.class.getResourceAsStream("native.properties")) {
      if (in != null) {
        p.load(in);
      } else {
        tried.add("native.properties (not in the jar)");
      }
    } catch (IOException e) {
      tried.add("native.properties (" + e.getMessage() + ")");
    }
    String name = p.getProperty("library.name", "libbufpool_java.so");
    String relative = p.getProperty("library.relative");
    Path jarDir = jarFolder();
    if (relative != null && jarDir != null) {
      Path lib = jarDir.resolve(relative).resolve(name).normalize();
      if (Files.exists(lib)) {
        out.add(lib.toString());
      } else {
        tried.add(lib + " (no such file)");
      }
    }
    String absolute = p.getProperty("library.absolute");
    if (absolute != null) {
      Path lib = Path.of(absolute, name);
      if (Files.exists(lib)) {
        out.add(lib.toString());
      } else {
        tried.add(lib + " (no such file)");
      }
    }
    out.add(name);  // the dynamic loader's search
    return out;
  }

  /** The folder of the jar (or classes folder) this class was loaded from. */
  private static Path jarFolder() {
    try {
      CodeSource cs = Native.class.getProtectionDomain().getCodeSource();
      if (cs == null || cs.getLocation() == null) {
        return null;
      }
      Path p = Path.of(cs.getLocation().toURI());
      return Files.isDirectory(p) ? p : p.getParent();
    } catch (URISyntaxException | RuntimeException e) {
      return null;
    }
  }

  private static MethodHandle handle(String name, FunctionDescriptor fd,
                                     Linker.Option... options) {
    MemorySegment symbol = LOOKUP.find(name).orElseThrow(
        () -> new UnsatisfiedLinkError(
            "io.bufpool: " + LIBRARY + " has no " + name
                + " (a libbufpool older than this jar?)"));
    return LINKER.downcallHandle(symbol, fd, options);
  }

  private static final Linker.Option CRITICAL = Linker.Option.critical(false);
  /** Critical, and may be passed heap segments (arrays). */
  private static final Linker.Option CRITICAL_HEAP = Linker.Option.critical(true);

  // The handles, in holder classes by use: linking a downcall handle costs
  // milliseconds in a JVM that has just started (tens with the first), so
  // each group is linked when first used, and a program pays only for the
  // calls it makes. A static final in a holder is a constant to the JIT.

  /** Creating a pool. */
  static final class Setup {
    // void bufpool_options_init(bufpool_options*, size_t)
    static final MethodHandle OPTIONS_INIT = handle("bufpool_options_init",
        FunctionDescriptor.ofVoid(ADDRESS, JAVA_LONG));
    // bufpool_pool* bufpool_create(const bufpool_options*, char** err)
    static final MethodHandle CREATE = handle("bufpool_create",
        FunctionDescriptor.of(JAVA_LONG, ADDRESS, ADDRESS));
    // void bufpool_region(const bufpool_pool*, void** base, size_t* length)
    static final MethodHandle REGION = handle("bufpool_region",
        FunctionDescriptor.ofVoid(JAVA_LONG, ADDRESS, ADDRESS));
  }

  /** Freeing an error string. */
  static final class Errors {
    // void bufpool_free_error(char*)
    static final MethodHandle FREE_ERROR = handle("bufpool_free_error",
        FunctionDescriptor.ofVoid(ADDRESS));
  }

  /** The per-buffer calls. */
  static final class Hot {
    // void* bufpool_try_acquire(bufpool_pool*)
    static final MethodHandle TRY_ACQUIRE = handle("bufpool_try_acquire",
        FunctionDescriptor.of(JAVA_LONG, JAVA_LONG), CRITICAL);
    // void bufpool_release(bufpool_pool*, void*)
    static final MethodHandle RELEASE = handle("bufpool_release",
        FunctionDescriptor.ofVoid(JAVA_LONG, JAVA_LONG), CRITICAL);
  }

  /** Many buffers per call. */
  static final class Bulk {
    // size_t bufpool_try_acquire_bulk(bufpool_pool*, void** out, size_t n)
    static final MethodHandle TRY_ACQUIRE_BULK = handle("bufpool_try_acquire_bulk",
        FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, ADDRESS, JAVA_LONG), CRITICAL_HEAP);
    // void bufpool_release_bulk(bufpool_pool*, void* const* in, size_t n)
    static final MethodHandle RELEASE_BULK = handle("bufpool_release_bulk",
        FunctionDescriptor.ofVoid(JAVA_LONG, ADDRESS, JAVA_LONG), CRITICAL_HEAP);
  }

  /** Waiting for a buffer. */
  static final class Wait {
    // void* bufpool_acquire(bufpool_pool*, int64_t timeout_ns, char** err):
    // may sleep, so not critical.
    static final MethodHandle ACQUIRE = handle("bufpool_acquire",
        FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG, ADDRESS));
  }

  /** Counters, reports, teardown. */
  static final class Admin {
    // void bufpool_get_stats_sized(const bufpool_pool*, bufpool_stats*, size_t)
    static final MethodHandle GET_STATS = handle("bufpool_get_stats_sized",
        FunctionDescriptor.ofVoid(JAVA_LONG, ADDRESS, JAVA_LONG), CRITICAL_HEAP);
    // void bufpool_destroy(bufpool_pool*)
    static final MethodHandle DESTROY = handle("bufpool_destroy",
        FunctionDescriptor.ofVoid(JAVA_LONG));
    // size_t bufpool_holders_report(const bufpool_pool*, size_t, char*, size_t)
    static final MethodHandle HOLDERS_REPORT = handle("bufpool_holders_report",
        FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG, ADDRESS, JAVA_LONG));
    // size_t bufpool_write_metrics(const bufpool_pool*, const char*, char*, size_t)
    static final MethodHandle WRITE_METRICS = handle("bufpool_write_metrics",
        FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, ADDRESS, ADDRESS, JAVA_LONG));
    // void bufpool_flush_caches(bufpool_pool*): fences every CPU, not short.
    static final MethodHandle FLUSH_CACHES = handle("bufpool_flush_caches",
        FunctionDescriptor.ofVoid(JAVA_LONG));
  }

  // The byte offsets of bufpool_options' fields (LP64, c.h's order).
  static final long OPT_STRUCT_SIZE = 0;
  static final long OPT_BUFFER_SIZE = 8;
  static final long OPT_BUFFER_COUNT = 16;
  static final long OPT_HUGE_PAGES = 24;
  static final long OPT_POPULATE = 28;
  static final long OPT_LOCK_MEMORY = 32;
  static final long OPT_SCRUB_ON_RELEASE = 36;
  static final long OPT_CACHE_SIZE = 40;
  static final long OPT_MAX_BUFFER_COUNT = 48;
  static final long OPT_GROW_STEP = 56;
  static final long OPT_TRIM_AFTER_IDLE_NS = 64;
  static final long OPT_TRACK_HOLDERS = 72;
  static final long OPT_HOLDER_SAMPLE_EVERY = 76;
  static final long OPTIONS_SIZE = 80;

  /** bufpool_stats as 64-bit words, in c.h's order. */
  static final int STATS_WORDS = 11;

  /** Reads and frees the error string at *err (NULL: null). */
  static String takeError(MemorySegment errSlot) {
    MemorySegment err = errSlot.get(ADDRESS, 0);
    if (err.equals(MemorySegment.NULL)) {
      return null;
    }
    String text = err.reinterpret(Long.MAX_VALUE).getString(0);
    try {
      Errors.FREE_ERROR.invokeExact(err);
    } catch (Throwable t) {
      throw rethrow(t);
    }
    return text;
  }

  /** A Throwable from invokeExact, which the C API's calls never throw. */
  static RuntimeException rethrow(Throwable t) {
    if (t instanceof RuntimeException r) {
      return r;
    }
    if (t instanceof Error e) {
      throw e;
    }
    return new IllegalStateException("io.bufpool: unexpected " + t, t);
  }

}
