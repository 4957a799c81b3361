/* libbufpool's C API: the buffer pool of bufpool/buffer_pool.h for C
 * programs and for other languages that reach native code through a C ABI
 * (Rust, Go's cgo, Python's ctypes/cffi, Java's FFM API). C11; also usable
 * from C++. Every call is a thin shell over the C++ BufferPool, so the
 * behaviour, the checks and the messages are the C++ ones.
 *
 *   bufpool_options opts = BUFPOOL_OPTIONS_INIT;  (the C++ defaults)
 *   opts.buffer_size = 4096; opts.buffer_count = 1024;
 *   char* err = NULL;
 *   bufpool_pool* pool = bufpool_create(&opts, &err);
 *   if (pool == NULL) { report(err); bufpool_free_error(err); }
 *   void* b = bufpool_try_acquire(pool);  (NULL when none is free)
 *   ...
 *   bufpool_release(pool, b);
 *   bufpool_destroy(pool);
 *
 * Buffers. A pool maps one page-aligned region once and slices it into
 * buffer_count buffers of buffer_size bytes; buffer i starts at
 * base + i * buffer_size (see bufpool_region()). The acquire calls hand out
 * a buffer's start; each one must come back exactly once, through
 * bufpool_release() or bufpool_release_bulk(), before the pool is destroyed.
 *
 * Ownership: who frees what.
 *   - A bufpool_pool* from bufpool_create() is the caller's; free it with
 *     bufpool_destroy(), once.
 *   - Buffers belong to the pool; the caller borrows each one from its
 *     acquire until its release, and never free()s one.
 *   - An error string (char*) stored through an `err` argument is the
 *     caller's; free it with bufpool_free_error() (not free()). A call that
 *     stores a new error first frees, with bufpool_free_error(), the string
 *     *err held before (as LevelDB's C API does), so *err must be NULL or an
 *     error string from this library; `err` itself may be NULL when the
 *     caller does not want the message. Calls that succeed leave *err alone.
 *   - The library keeps no pointer to a bufpool_options or bufpool_stats
 *     after the call returns.
 *
 * Thread safety. Every call may be made from any number of threads at once
 * on the same pool, as in C++, except bufpool_destroy(), which must come
 * after every other call on that pool has returned (on every thread). A
 * buffer may be released on a different thread than the one that acquired
 * it. Each pool keeps a small cache of free buffers per CPU (see "Per-CPU
 * caches" in bufpool/buffer_pool.h); bufpool_try_acquire() returns NULL only
 * when no buffer was free in any of them or in the depot.
 *
 * Safety. The release calls check each pointer in O(1), in release builds
 * too, and abort the process with a one-line message on stderr when it is
 * not out: "double release" for a buffer that is free already, "not from
 * this pool" for any pointer that is not the start of one of this pool's
 * buffers (NULL included). bufpool_destroy() with buffers out aborts with
 * "still in use". These are programming errors that would corrupt memory,
 * so they are not returned.
 *
 * Compatibility. bufpool_options and bufpool_stats start with their own
 * size, so that fields can be added at their end later: a binary built
 * against this header keeps working with a later library, which fills in
 * the defaults of fields the binary does not know (options) and writes only
 * the bytes the binary's struct has (stats). No C++ exception crosses this
 * API: a call that could fail returns NULL (or 0, or -1) and a message.
 * cache_size was named thread_cache_size before 0.3; it keeps its place
 * and size, so binaries built against 0.2 still work.
 */
#ifndef BUFPOOL_C_H_
#define BUFPOOL_C_H_

#include <stddef.h>
#include <stdint.h>

#include "bufpool/export.h"

#ifdef __cplusplus
extern "C" {
#define BUFPOOL_C_NOEXCEPT noexcept
#else
#define BUFPOOL_C_NOEXCEPT
#endif

/* A pool; opaque. */
typedef struct bufpool_pool bufpool_pool;

/* Values of bufpool_options.huge_pages. */
enum {
  BUFPOOL_HUGE_PAGES_NEVER = 0,  /* 4 KiB pages only */
  BUFPOOL_HUGE_PAGES_TRY = 1,    /* advise transparent huge pages (2 MiB) */
  BUFPOOL_HUGE_PAGES_REQUIRE = 2 /* MAP_HUGETLB, or bufpool_create fails */
};

/* Values of bufpool_options.track_holders (bufpool/holders.h). */
enum {
  BUFPOOL_TRACK_HOLDERS_OFF = 0,     /* nothing recorded: free */
  BUFPOOL_TRACK_HOLDERS_SAMPLED = 1, /* 1 in holder_sample_every acquires */
  BUFPOOL_TRACK_HOLDERS_ALL = 2      /* every acquire (tests, leak hunts) */
};

/* What bufpool_create() builds. Start from BUFPOOL_OPTIONS_INIT (or
 * bufpool_options_init()), which sets struct_size and the C++ defaults, then
 * change the fields you need. Boolean fields: 0 is false, anything else
 * true. */
typedef struct bufpool_options {
  size_t struct_size;   /* sizeof(bufpool_options) of the caller */
  size_t buffer_size;   /* power of two, >= 64; default 4096 */
  size_t buffer_count;  /* >= 1, < 2^32 - 1; default 1024 */
  int huge_pages;       /* BUFPOOL_HUGE_PAGES_*; default _TRY */
  int populate;         /* fault every page in at create; default 1 */
  int lock_memory;      /* mlock the region (RLIMIT_MEMLOCK); default 0 */
  int scrub_on_release; /* zero a buffer on release; default 0 */
  size_t cache_size;    /* per-CPU cache, <= 512, 0: none; default 64 */
  /* An elastic pool (since 0.3; see "Elastic pools" in buffer_pool.h).
   * A caller whose struct_size ends before these gets their defaults. */
  size_t max_buffer_count;    /* the ceiling; 0: a fixed pool; default 0 */
  size_t grow_step;           /* buffers per growth step; default 512 */
  int64_t trim_after_idle_ns; /* trim what stayed free this long; 0: off */
  /* Holder tracking (since 0.3; a struct_size that ends before a field
     keeps its default). BUFPOOL_TRACK_HOLDERS in the environment
     overrides it. */
  int track_holders;            /* BUFPOOL_TRACK_HOLDERS_*; default _OFF */
  uint32_t holder_sample_every; /* _SAMPLED: 1 in this many; default 128 */
  /* A pool shared by processes (since 0.4; see "Shared pools" in
     buffer_pool.h and bufpool_join() below); default 0. */
  int shared;
} bufpool_options;

/* The C++ defaults (PoolOptions{}); the library checks at compile time that
 * they still match. An initializer: bufpool_options o = BUFPOOL_OPTIONS_INIT;
 */
#define BUFPOOL_OPTIONS_INIT                                                  \
  {                                                                           \
    sizeof(bufpool_options), 4096, 1024, BUFPOOL_HUGE_PAGES_TRY, 1, 0, 0, 64, \
        0, 512, 0, BUFPOOL_TRACK_HOLDERS_OFF, 128, 0                          \
  }

/* A snapshot of a pool's counters; see PoolStats and BufferPool::Stats() in
 * bufpool/buffer_pool.h for when each is exact. */
typedef struct bufpool_stats {
  size_t struct_size;        /* set by the library: the bytes it filled */
  size_t capacity;           /* buffer_count */
  size_t in_use;             /* held by users (cached free ones are free) */
  size_t high_water;         /* never below the largest in_use */
  uint64_t acquire_failures; /* acquire calls that got nothing, bulk calls
                                that got fewer than asked */
  uint64_t acquire_timeouts; /* bufpool_acquire() calls that waited and
                                timed out */
  size_t cached;             /* free buffers parked in the per-CPU caches
                                (since 0.3) */
  size_t committed;          /* buffers backed by memory now (since 0.3) */
  uint64_t grows;            /* growth steps taken */
  uint64_t trims;            /* trims that gave memory back */
  uint64_t grow_failures;    /* growth steps the system refused */
  /* Shared pools (since 0.4): processes joined now (dead ones not yet
     reclaimed count), and buffers reclaimed from dead ones; a private
     pool: 1 and 0. */
  size_t processes;
  uint64_t reclaimed;
} bufpool_stats;

/* Fills the first `options_size` bytes of *options with BUFPOOL_OPTIONS_INIT
 * as this library knows it, struct_size = options_size. For callers that
 * cannot use the macro (other languages): pass sizeof of your struct. */
BUFPOOL_EXPORT void bufpool_options_init(
    bufpool_options* options, size_t options_size) BUFPOOL_C_NOEXCEPT;

/* Creates a pool. `options` may be NULL for the defaults. On failure returns
 * NULL and stores in *err (when err is not NULL) the C++ error in its words,
 * for a bad option naming the field and its value, e.g.
 * "INVALID_ARGUMENT: ... buffer_size ... 100 ...". */
BUFPOOL_EXPORT bufpool_pool* bufpool_create(const bufpool_options* options,
                                            char** err) BUFPOOL_C_NOEXCEPT;

/* Frees the pool and unmaps its region. Aborts with "still in use" while any
 * buffer is out. NULL is ignored. Not concurrent with other calls on it. */
BUFPOOL_EXPORT void bufpool_destroy(bufpool_pool* pool) BUFPOOL_C_NOEXCEPT;

/* Frees an error string stored through an `err` argument. NULL is ignored. */
BUFPOOL_EXPORT void bufpool_free_error(char* err) BUFPOOL_C_NOEXCEPT;

/* A free buffer (buffer_size bytes, aligned to buffer_size and to the page),
 * or NULL when none is free (counted in acquire_failures). Never waits. */
BUFPOOL_EXPORT void* bufpool_try_acquire(bufpool_pool* pool) BUFPOOL_C_NOEXCEPT;

/* Returns at once when a buffer is free; otherwise waits until one is
 * released or timeout_ns nanoseconds pass, then returns NULL and stores
 * "DEADLINE_EXCEEDED: ..." in *err (when err is not NULL). A timeout of zero
 * or less only tries once; INT64_MAX (over a century) waits forever. It
 * waits only while every buffer is in use. */
BUFPOOL_EXPORT void* bufpool_acquire(bufpool_pool* pool, int64_t timeout_ns,
                                     char** err) BUFPOOL_C_NOEXCEPT;

/* Gives a buffer back. Aborts with "double release" when `buffer` is free
 * already and with "not from this pool" when it is not the start of one of
 * this pool's buffers (NULL included). */
BUFPOOL_EXPORT void bufpool_release(bufpool_pool* pool,
                                    void* buffer) BUFPOOL_C_NOEXCEPT;

/* Fills out[0, k) with up to n buffers and returns k; k < n only when the
 * pool ran out, and then out[k, n) is set to NULL and one failure counted. */
BUFPOOL_EXPORT size_t bufpool_try_acquire_bulk(bufpool_pool* pool, void** out,
                                               size_t n) BUFPOOL_C_NOEXCEPT;

/* Gives back every non-NULL in[0, n) (so a short fill can be passed back
 * whole), cheaper than one by one; aborts as bufpool_release() does on any
 * other pointer that is not out. `in` is not changed. */
BUFPOOL_EXPORT void bufpool_release_bulk(bufpool_pool* pool, void* const* in,
                                         size_t n) BUFPOOL_C_NOEXCEPT;

/* Writes 1 (eight bytes) to the eventfd `event_fd` once a buffer is free at
 * or after this call: at once when one is free now. One-shot. Returns 0, or
 * -1 with the message in *err (a negative fd, out of memory). See
 * BufferPool::NotifyWhenFree(). */
BUFPOOL_EXPORT int bufpool_notify_when_free(bufpool_pool* pool, int event_fd,
                                            char** err) BUFPOOL_C_NOEXCEPT;

/* Moves every CPU's cached free buffers to the depot. */
BUFPOOL_EXPORT void bufpool_flush_caches(bufpool_pool* pool) BUFPOOL_C_NOEXCEPT;

/* Writes the first min(stats_size, the library's sizeof(bufpool_stats))
 * bytes of *stats and sets stats->struct_size to that count. C callers use
 * bufpool_get_stats() below, an inline function that passes the size of
 * their struct; other languages call this one. */
BUFPOOL_EXPORT void bufpool_get_stats_sized(
    const bufpool_pool* pool, bufpool_stats* stats,
    size_t stats_size) BUFPOOL_C_NOEXCEPT;

static inline void bufpool_get_stats(const bufpool_pool* pool,
                                     bufpool_stats* stats) BUFPOOL_C_NOEXCEPT {
  bufpool_get_stats_sized(pool, stats, sizeof(*stats));
}

/* The whole region, page-aligned (2 MiB-aligned with huge pages), for
 * io_uring fixed buffers or RDMA registration: *base and *length (either
 * pointer may be NULL). Valid for the pool's lifetime. */
BUFPOOL_EXPORT void bufpool_region(const bufpool_pool* pool, void** base,
                                   size_t* length) BUFPOOL_C_NOEXCEPT;

/* The pool's metrics in the Prometheus text format (bufpool/metrics.h),
 * with the label pool="name" on every sample (name NULL or "": none), as
 * snprintf() writes: at most size - 1 bytes and a NUL into buf (buf may be
 * NULL when size is 0). Returns the length of the whole text, without the
 * NUL: call again with a larger buffer when it is >= size. 0 when memory
 * for the text cannot be had. Any thread. */
BUFPOOL_EXPORT size_t bufpool_write_metrics(const bufpool_pool* pool,
                                            const char* name, char* buf,
                                            size_t size) BUFPOOL_C_NOEXCEPT;

/* An elastic pool (max_buffer_count): gives the memory of free buffers in
 * the depot back to the kernel until at most keep_free stay backed,
 * never a buffer in use or cached; returns the bytes given back (0 for a
 * fixed pool). See BufferPool::Trim(). */
BUFPOOL_EXPORT size_t bufpool_trim(bufpool_pool* pool,
                                   size_t keep_free) BUFPOOL_C_NOEXCEPT;
/* trim_after_idle's tick (BufferPool::TrimIdle()): never blocks; returns the
 * bytes given back. */
BUFPOOL_EXPORT size_t bufpool_trim_idle(bufpool_pool* pool) BUFPOOL_C_NOEXCEPT;
/* Backs at least `buffers` more buffers now (BufferPool::Grow()). Returns 0,
 * or -1 with the message in *err: at the ceiling, the system refused (its
 * words and limit), or a fixed pool. */
BUFPOOL_EXPORT int bufpool_grow(bufpool_pool* pool, size_t buffers,
                                char** err) BUFPOOL_C_NOEXCEPT;

/* Who holds the pool's buffers (BufferPool::HoldersReport(), at most
 * max_holders acquire sites), as bufpool_write_metrics() writes: at most
 * size - 1 bytes and a NUL into buf (NULL when size is 0); returns the
 * length of the whole text, 0 when memory for it cannot be had. With
 * tracking off, the counts per kind of holder and how to turn tracking on.
 * Any thread; symbolizes stacks, so it may take milliseconds. */
BUFPOOL_EXPORT size_t bufpool_holders_report(const bufpool_pool* pool,
                                             size_t max_holders, char* buf,
                                             size_t size) BUFPOOL_C_NOEXCEPT;

/* ---- Shared pools (since 0.4; "Shared pools" in bufpool/buffer_pool.h) ---
 *
 * A pool created with options.shared = 1 lives in a sealed memfd that
 * other processes join: pass bufpool_shared_fd() over a Unix socket
 * (SCM_RIGHTS), or let a forked child inherit it, and bufpool_join() it
 * there. Each process gets the same buffers (at its own addresses: slots
 * are by number) and its own per-CPU caches. A buffer crosses processes as
 * a token: bufpool_export() in one, bufpool_import() in another, once.
 * Everything a process held when it died comes back with
 * bufpool_reclaim_dead() in any live process (also run on the slow path).
 * A forked child must join; it may not use its parent's bufpool_pool*.
 * Processes that join one pool are trusted with its shared state. */

/* The memfd of a shared pool (the pool owns it: do not close it), -1 for
 * a private one. */
BUFPOOL_EXPORT int bufpool_shared_fd(const bufpool_pool* pool)
    BUFPOOL_C_NOEXCEPT;
/* Joins the shared pool behind `fd` (dup'd; the caller keeps its copy):
 * a bufpool_pool* of this process's, freed with bufpool_destroy(). NULL
 * and the message in *err for a descriptor that is not a pool's memfd, a
 * layout of another version, or a full process table. */
BUFPOOL_EXPORT bufpool_pool* bufpool_join(int fd,
                                          char** err) BUFPOOL_C_NOEXCEPT;
/* Hands `buffer` (out as from bufpool_try_acquire(); no longer the
 * caller's) to whoever imports the returned token, once; nonzero. Aborts as
 * bufpool_release() does when `buffer` is not out. On a private pool it
 * works within the process; its first export allocates the pool's export
 * ledger (8 bytes a buffer), and if that fails the buffer is released and
 * the token is 0. */
BUFPOOL_EXPORT uint64_t bufpool_export(bufpool_pool* pool,
                                       void* buffer) BUFPOOL_C_NOEXCEPT;
/* The exported buffer named by `token`, now the caller's (released with
 * bufpool_release()); NULL and the message in *err for a forged token
 * ("INVALID_ARGUMENT: ...") or one stale or imported already
 * ("FAILED_PRECONDITION: ..."): nothing changes then. */
BUFPOOL_EXPORT void* bufpool_import(bufpool_pool* pool, uint64_t token,
                                    char** err) BUFPOOL_C_NOEXCEPT;
/* Gives back everything processes that died held; the buffers reclaimed.
 * 0 for a private pool. */
BUFPOOL_EXPORT size_t bufpool_reclaim_dead(bufpool_pool* pool)
    BUFPOOL_C_NOEXCEPT;

/* The pool's buffer_size and buffer_count (an elastic pool: its ceiling). */
BUFPOOL_EXPORT size_t bufpool_buffer_size(const bufpool_pool* pool)
    BUFPOOL_C_NOEXCEPT;
BUFPOOL_EXPORT size_t bufpool_capacity(const bufpool_pool* pool)
    BUFPOOL_C_NOEXCEPT;

/* ---- Budgets (since 0.3; bufpool/budget.h) -------------------------------
 *
 * A budget is a named share of one pool for one consumer (a connection, a
 * tenant): a byte limit, high/low watermarks whose callbacks fire once each
 * way (hysteresis), and an optional reservation taken from the pool up
 * front. The C API has no chains, so C code charges a budget by taking its
 * buffers through it: bufpool_budget_acquire() hands out a whole buffer and
 * charges buffer_size bytes, bufpool_budget_release() gives it back and
 * takes the charge off. Past max_bytes the acquire returns NULL and
 * "RESOURCE_EXHAUSTED: ... budget "<name>" is at its limit of N bytes ...",
 * counted in refusals; nothing is taken. The first reserved_bytes of
 * buffers come from the budget's reserve, so they are there even when other
 * consumers have drained the pool.
 *
 *   bufpool_budget_options bo = BUFPOOL_BUDGET_OPTIONS_INIT;
 *   bo.name = "conn 7"; bo.max_bytes = 64 * 4096;
 *   bo.high_watermark = 48 * 4096; bo.low_watermark = 24 * 4096;
 *   bo.on_high = pause_reading; bo.on_low = resume_reading; bo.user_data = c;
 *   bufpool_budget* budget = bufpool_budget_create(pool, &bo, &err);
 *   void* b = bufpool_budget_acquire(budget, &err);  (NULL: refused or dry)
 *   ...
 *   bufpool_budget_release(budget, b);
 *   bufpool_budget_destroy(budget);  (before bufpool_destroy(pool))
 *
 * Ownership. A bufpool_budget* is the caller's; free it with
 * bufpool_budget_destroy(), once, after every buffer it handed out came back
 * through bufpool_budget_release() (it aborts naming the budget and the
 * bytes otherwise) and before its pool is destroyed (its reserve is buffers
 * of the pool). The name is copied; the library keeps no pointer to the
 * options. Buffers from bufpool_budget_acquire() go back only through
 * bufpool_budget_release() of the same budget (not bufpool_release()).
 *
 * Thread safety. A budget is used by one thread at a time (the consumer's
 * loop): its acquire and release calls, and the callbacks they run, are not
 * synchronized with each other. bufpool_budget_get_stats_sized() and
 * bufpool_write_metrics() may read it from any thread at any time.
 * bufpool_budget_create() and bufpool_budget_destroy() of different
 * budgets may run on any threads at once.
 *
 * Callbacks. on_high(user_data) runs when the budget's pinned bytes rise to
 * high_watermark or above, and not again until on_low(user_data) has run,
 * when they fall back to low_watermark or below. Both run inside the
 * acquire or release call that crossed the mark, on its thread; they must
 * not call the budget's acquire, release or destroy. NULL: none. */

/* A budget; opaque. */
typedef struct bufpool_budget bufpool_budget;

/* A watermark callback; gets bufpool_budget_options.user_data. */
typedef void (*bufpool_budget_callback)(void* user_data);

/* What bufpool_budget_create() builds. Start from
 * BUFPOOL_BUDGET_OPTIONS_INIT (or bufpool_budget_options_init()), then set
 * at least max_bytes. Fields added later go at the end, as in
 * bufpool_options. */
typedef struct bufpool_budget_options {
  size_t struct_size;    /* sizeof(bufpool_budget_options) of the caller */
  const char* name;      /* in errors, reports, metrics; NULL: "" */
  size_t max_bytes;      /* >= buffer_size, rounded down to whole
                            buffers; SIZE_MAX: no limit; no default */
  size_t high_watermark; /* 0: no watermarks; else low < high <= max */
  size_t low_watermark;  /* on_low once pinned bytes fall to this */
  bufpool_budget_callback on_high; /* NULL: none */
  bufpool_budget_callback on_low;  /* NULL: none */
  void* user_data;                 /* passed to on_high and on_low */
  size_t reserved_bytes; /* taken from the pool up front, rounded up to
                            whole buffers; <= max_bytes; default 0 */
  /* Since 0.4: metrics write budgets of one group as one series (see
   * BudgetOptions::group); NULL or "": a series of its own. */
  const char* group;
} bufpool_budget_options;

/* Everything 0 but struct_size: max_bytes must be set. */
#define BUFPOOL_BUDGET_OPTIONS_INIT \
  { sizeof(bufpool_budget_options), NULL, 0, 0, 0, NULL, NULL, NULL, 0, NULL }

/* Fills the first `options_size` bytes of *options as
 * BUFPOOL_BUDGET_OPTIONS_INIT does, struct_size = options_size. */
BUFPOOL_EXPORT void bufpool_budget_options_init(
    bufpool_budget_options* options, size_t options_size) BUFPOOL_C_NOEXCEPT;

/* A snapshot of a budget's counters (BudgetStats). */
typedef struct bufpool_budget_stats {
  size_t struct_size;      /* set by the library: the bytes it filled */
  size_t pinned_bytes;     /* charged now: buffers out through the budget */
  size_t high_water_bytes; /* the most charged at once */
  uint64_t refusals;       /* acquires refused at the limit */
  size_t max_bytes;        /* the limit, rounded down to whole buffers */
  size_t reserve_buffers;  /* buffers held in the reserve now */
} bufpool_budget_stats;

/* Creates a budget on `pool`. On failure returns NULL and stores the
 * message in *err: "INVALID_ARGUMENT: ..." naming the field and its value
 * (max_bytes below one buffer, watermarks out of order, a reservation past
 * max_bytes, a struct_size this library does not know), or
 * "RESOURCE_EXHAUSTED: ..." when the reservation, with the pool's other
 * reservations and ring lending, would over-commit the pool or the pool has
 * not that many buffers free, naming the numbers. */
BUFPOOL_EXPORT bufpool_budget* bufpool_budget_create(
    bufpool_pool* pool, const bufpool_budget_options* options,
    char** err) BUFPOOL_C_NOEXCEPT;

/* Gives the reserve back to the pool and frees the budget. Aborts, naming
 * the budget and the bytes, while buffers it handed out are not back. NULL
 * is ignored. */
BUFPOOL_EXPORT void bufpool_budget_destroy(bufpool_budget* budget)
    BUFPOOL_C_NOEXCEPT;

/* A buffer charged to the budget (from its reserve while it has one, else
 * from the pool), or NULL with the message in *err (when err is not NULL):
 * "RESOURCE_EXHAUSTED: bufpool_budget_acquire: budget ..." when one more
 * buffer would take it past max_bytes (a refusal), or
 * "RESOURCE_EXHAUSTED: bufpool_budget_acquire: the pool has no free buffer
 * ..." when the pool is dry. Never waits. May run on_high. */
BUFPOOL_EXPORT void* bufpool_budget_acquire(bufpool_budget* budget,
                                            char** err) BUFPOOL_C_NOEXCEPT;

/* Gives back a buffer from bufpool_budget_acquire() of this budget and
 * takes its charge off (refilling a short reserve from it). Aborts as
 * bufpool_release() does on a pointer that is not out, and with "released
 * more than it acquired" when the budget has nothing charged. May run
 * on_low. */
BUFPOOL_EXPORT void bufpool_budget_release(bufpool_budget* budget,
                                           void* buffer) BUFPOOL_C_NOEXCEPT;

/* Writes the first min(stats_size, sizeof(bufpool_budget_stats)) bytes of
 * *stats and sets stats->struct_size to that count; bufpool_budget_get_stats()
 * passes the size of the caller's struct. Any thread. */
BUFPOOL_EXPORT void bufpool_budget_get_stats_sized(
    const bufpool_budget* budget, bufpool_budget_stats* stats,
    size_t stats_size) BUFPOOL_C_NOEXCEPT;

static inline void bufpool_budget_get_stats(const bufpool_budget* budget,
                                            bufpool_budget_stats* stats)
    BUFPOOL_C_NOEXCEPT {
  bufpool_budget_get_stats_sized(budget, stats, sizeof(*stats));
}

/* The budget's name as snprintf() writes (see bufpool_write_metrics());
 * returns its length. */
BUFPOOL_EXPORT size_t bufpool_budget_name(const bufpool_budget* budget,
                                          char* buf,
                                          size_t size) BUFPOOL_C_NOEXCEPT;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BUFPOOL_C_H_ */
