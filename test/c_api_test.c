/* The C API (bufpool/c.h) from a program compiled as C: every call, the
 * errors, the abort messages (each provoked in a forked child whose stderr
 * is read back) and use from 8 threads.
 *
 *   c_api_test            runs every test
 *   c_api_test NAME...    runs the named ones (ctest runs each alone)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bufpool/c.h"

#ifdef __cplusplus
#error "c_api_test.c tests the C API from C: compile it as C"
#endif
#if !defined(__STDC_VERSION__) || __STDC_VERSION__ < 201112L
#error "c_api_test.c is C11"
#endif

static int g_failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                            \
    }                                                                          \
  } while (0)

/* For what the rest of a test cannot go on without. */
#define REQUIRE(cond)                                                    \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, \
              #cond);                                                    \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

static int contains(const char* s, const char* part) {
  return s != NULL && strstr(s, part) != NULL;
}

/* A pool with `count` buffers of 4096 bytes, else the test stops. */
static bufpool_pool* make_pool(size_t count, size_t cache_size) {
  bufpool_options o = BUFPOOL_OPTIONS_INIT;
  o.buffer_count = count;
  o.cache_size = cache_size;
  char* err = NULL;
  bufpool_pool* pool = bufpool_create(&o, &err);
  if (pool == NULL) fprintf(stderr, "bufpool_create: %s\n", err);
  REQUIRE(pool != NULL);
  CHECK(err == NULL);
  return pool;
}

static bufpool_stats stats_of(const bufpool_pool* pool) {
  bufpool_stats st;
  memset(&st, 0xab, sizeof(st));
  bufpool_get_stats(pool, &st);
  CHECK(st.struct_size == sizeof(st));
  return st;
}

/* ---- Options and creation ---------------------------------------------- */

static void test_options_defaults(void) {
  const bufpool_options macro = BUFPOOL_OPTIONS_INIT;
  bufpool_options fn;
  memset(&fn, 0xab, sizeof(fn));
  bufpool_options_init(&fn, sizeof(fn));
  /* Every field, not the tail padding after the last (which an
     initializer leaves undefined). */
  CHECK(memcmp(&macro, &fn,
               offsetof(bufpool_options, shared) + sizeof(fn.shared)) == 0);
  CHECK(macro.struct_size == sizeof(bufpool_options));
  CHECK(macro.buffer_size == 4096);
  CHECK(macro.buffer_count == 1024);
  CHECK(macro.huge_pages == BUFPOOL_HUGE_PAGES_TRY);
  CHECK(macro.populate == 1);
  CHECK(macro.lock_memory == 0);
  CHECK(macro.scrub_on_release == 0);
  CHECK(macro.cache_size == 64);
  CHECK(macro.max_buffer_count == 0);
  CHECK(macro.grow_step == 512);
  CHECK(macro.trim_after_idle_ns == 0);
  CHECK(macro.track_holders == BUFPOOL_TRACK_HOLDERS_OFF);
  CHECK(macro.holder_sample_every == 128);
  CHECK(macro.shared == 0);

  /* A caller with an older, shorter struct: only its bytes are written. */
  unsigned char raw[sizeof(bufpool_options) + 8];
  memset(raw, 0xab, sizeof(raw));
  const size_t shorter = offsetof(bufpool_options, cache_size);
  bufpool_options_init((bufpool_options*)(void*)raw, shorter);
  bufpool_options head;
  memcpy(&head, raw, shorter);
  CHECK(head.struct_size == shorter);
  CHECK(head.buffer_count == 1024);
  for (size_t i = shorter; i < sizeof(raw); ++i) CHECK(raw[i] == 0xab);
}

static void test_create_reports_geometry(void) {
  bufpool_options o = BUFPOOL_OPTIONS_INIT;
  o.buffer_size = 8192;
  o.buffer_count = 16;
  o.huge_pages = BUFPOOL_HUGE_PAGES_NEVER;
  o.populate = 0;
  char* err = NULL;
  bufpool_pool* pool = bufpool_create(&o, &err);
  REQUIRE(pool != NULL);
  CHECK(err == NULL);
  CHECK(bufpool_buffer_size(pool) == 8192);
  CHECK(bufpool_capacity(pool) == 16);
  void* base = NULL;
  size_t len = 0;
  bufpool_region(pool, &base, &len);
  CHECK(base != NULL);
  CHECK((uintptr_t)base % 4096 == 0);
  CHECK(len == 16 * 8192);
  bufpool_region(pool, NULL, &len); /* either out-pointer may be NULL */
  bufpool_region(pool, &base, NULL);
  bufpool_stats st = stats_of(pool);
  CHECK(st.capacity == 16);
  CHECK(st.in_use == 0);
  CHECK(st.high_water == 0);
  CHECK(st.acquire_failures == 0);
  CHECK(st.acquire_timeouts == 0);
  bufpool_destroy(pool);

  /* NULL options: the defaults. */
  pool = bufpool_create(NULL, &err);
  REQUIRE(pool != NULL);
  CHECK(bufpool_buffer_size(pool) == 4096);
  CHECK(bufpool_capacity(pool) == 1024);
  bufpool_destroy(pool);
  bufpool_destroy(NULL); /* ignored */
}

/* bufpool_create fails with `o` and an error that contains every one of
 * `want` (NULL-terminated). */
static void expect_create_error(const bufpool_options* o, const char* want[]) {
  char* err = NULL;
  CHECK(bufpool_create(o, &err) == NULL);
  REQUIRE(err != NULL);
  for (const char** w = want; *w != NULL; ++w) {
    if (!contains(err, *w)) {
      fprintf(stderr, "error \"%s\" lacks \"%s\"\n", err, *w);
      ++g_failures;
    }
  }
  bufpool_free_error(err);
}

static void test_create_errors_name_field_and_value(void) {
  bufpool_options o = BUFPOOL_OPTIONS_INIT;
  o.buffer_size = 100;
  expect_create_error(
      &o, (const char*[]){"INVALID_ARGUMENT", "buffer_size", "100", NULL});

  o = (bufpool_options)BUFPOOL_OPTIONS_INIT;
  o.buffer_count = 0;
  expect_create_error(&o, (const char*[]){"buffer_count", "0", NULL});

  o = (bufpool_options)BUFPOOL_OPTIONS_INIT;
  o.huge_pages = 7;
  expect_create_error(&o, (const char*[]){"huge_pages", "7", NULL});
  o = (bufpool_options)BUFPOOL_OPTIONS_INIT;
  o.track_holders = 9;
  expect_create_error(&o, (const char*[]){"track_holders", "9", NULL});

  o = (bufpool_options)BUFPOOL_OPTIONS_INIT;
  o.struct_size = 8; /* older than the first version */
  expect_create_error(&o, (const char*[]){"struct_size", "8", NULL});

  o = (bufpool_options)BUFPOOL_OPTIONS_INIT;
  o.struct_size = sizeof(o) + 8; /* newer than this library */
  expect_create_error(&o, (const char*[]){"struct_size", "newer", NULL});

  /* A second failure frees the first message before storing its own (the
   * sanitizer builds catch a leak or a double free here). */
  char* err = NULL;
  o = (bufpool_options)BUFPOOL_OPTIONS_INIT;
  o.buffer_size = 100;
  CHECK(bufpool_create(&o, &err) == NULL);
  CHECK(contains(err, "buffer_size"));
  o.buffer_size = 4096;
  o.buffer_count = 0;
  CHECK(bufpool_create(&o, &err) == NULL);
  CHECK(contains(err, "buffer_count"));
  /* Success leaves *err alone. */
  bufpool_pool* pool = bufpool_create(NULL, &err);
  CHECK(pool != NULL);
  CHECK(contains(err, "buffer_count"));
  bufpool_destroy(pool);
  bufpool_free_error(err);
  bufpool_free_error(NULL);

  /* err may be NULL: the failure is still reported by the NULL pool. */
  CHECK(bufpool_create(&o, NULL) == NULL);
}

/* ---- Acquire and release ------------------------------------------------ */

static void test_try_acquire_until_empty(void) {
  enum { kCount = 8 };
  bufpool_pool* pool = make_pool(kCount, 64);
  void* base = NULL;
  size_t len = 0;
  bufpool_region(pool, &base, &len);
  void* got[kCount];
  for (int i = 0; i < kCount; ++i) {
    got[i] = bufpool_try_acquire(pool);
    REQUIRE(got[i] != NULL);
    const uintptr_t off = (uintptr_t)got[i] - (uintptr_t)base;
    CHECK(off < len);
    CHECK(off % 4096 == 0); /* the start of buffer off / 4096 */
    memset(got[i], i, 4096);
    for (int j = 0; j < i; ++j) CHECK(got[j] != got[i]);
  }
  CHECK(bufpool_try_acquire(pool) == NULL); /* one thread gets them all */
  for (int i = 0; i < kCount; ++i) {
    const unsigned char* p = got[i];
    CHECK(p[0] == (unsigned char)i && p[4095] == (unsigned char)i);
  }
  bufpool_stats st = stats_of(pool);
  CHECK(st.in_use == kCount);
  CHECK(st.high_water == kCount);
  CHECK(st.acquire_failures == 1);
  for (int i = 0; i < kCount; ++i) bufpool_release(pool, got[i]);
  st = stats_of(pool);
  CHECK(st.in_use == 0);
  CHECK(st.high_water == kCount);
  /* Released buffers come back. */
  void* again = bufpool_try_acquire(pool);
  CHECK(again != NULL);
  bufpool_release(pool, again);
  bufpool_destroy(pool);
}

static void test_options_reach_the_pool(void) {
  /* scrub_on_release: a released buffer is zeroed before it is handed out
   * again (caches off, so the same buffer comes back). */
  bufpool_options o = BUFPOOL_OPTIONS_INIT;
  o.buffer_count = 1;
  o.scrub_on_release = 1;
  o.cache_size = 0;
  bufpool_pool* pool = bufpool_create(&o, NULL);
  REQUIRE(pool != NULL);
  unsigned char* b = bufpool_try_acquire(pool);
  REQUIRE(b != NULL);
  memset(b, 0x5a, 4096);
  bufpool_release(pool, b);
  b = bufpool_try_acquire(pool);
  REQUIRE(b != NULL);
  CHECK(b[0] == 0 && b[2048] == 0 && b[4095] == 0);
  bufpool_release(pool, b);
  bufpool_destroy(pool);
}

static void test_acquire_times_out_with_error(void) {
  bufpool_pool* pool = make_pool(1, 64);
  char* err = NULL;
  void* b = bufpool_acquire(pool, 1000000000, &err); /* free: no wait */
  REQUIRE(b != NULL);
  CHECK(err == NULL);

  CHECK(bufpool_acquire(pool, 0, &err) == NULL); /* a poll */
  CHECK(contains(err, "DEADLINE_EXCEEDED"));
  bufpool_free_error(err);
  err = NULL;
  bufpool_stats st = stats_of(pool);
  CHECK(st.acquire_failures == 1);
  CHECK(st.acquire_timeouts == 0); /* a poll does not wait */

  CHECK(bufpool_acquire(pool, 1000000 /* 1 ms */, &err) == NULL);
  CHECK(contains(err, "DEADLINE_EXCEEDED"));
  CHECK(contains(err, "1ms"));
  bufpool_free_error(err);
  st = stats_of(pool);
  CHECK(st.acquire_timeouts == 1);
  CHECK(bufpool_acquire(pool, 1000000, NULL) == NULL); /* err may be NULL */
  bufpool_release(pool, b);
  bufpool_destroy(pool);
}

struct waiter {
  bufpool_pool* pool;
  void* got;
  char* err;
};

static void* wait_forever(void* arg) {
  struct waiter* w = arg;
  w->got = bufpool_acquire(w->pool, INT64_MAX, &w->err);
  return NULL;
}

static void test_acquire_waits_for_a_release(void) {
  /* One buffer, no caches: the waiter can only get it from the release. */
  bufpool_pool* pool = make_pool(1, 0);
  void* b = bufpool_try_acquire(pool);
  REQUIRE(b != NULL);
  struct waiter w = {pool, NULL, NULL};
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, wait_forever, &w) == 0);
  /* Whether the waiter is asleep yet or not, it ends up with b. */
  bufpool_release(pool, b);
  REQUIRE(pthread_join(t, NULL) == 0);
  CHECK(w.got == b);
  CHECK(w.err == NULL);
  if (w.got != NULL) bufpool_release(pool, w.got);
  CHECK(stats_of(pool).in_use == 0);
  bufpool_destroy(pool);
}

static void test_bulk_calls(void) {
  enum { kCount = 20, kAsk = 32 };
  bufpool_pool* pool = make_pool(kCount, 64);
  void* out[kAsk];
  memset(out, 0xab, sizeof(out));
  CHECK(bufpool_try_acquire_bulk(pool, out, kAsk) == kCount); /* ran out */
  for (int i = 0; i < kCount; ++i) {
    REQUIRE(out[i] != NULL);
    memset(out[i], 0x11, 4096);
    for (int j = 0; j < i; ++j) CHECK(out[j] != out[i]);
  }
  for (int i = kCount; i < kAsk; ++i) CHECK(out[i] == NULL);
  bufpool_stats st = stats_of(pool);
  CHECK(st.in_use == kCount);
  CHECK(st.acquire_failures == 1);
  void* copy[kAsk];
  memcpy(copy, out, sizeof(out));
  bufpool_release_bulk(pool, out, kAsk);      /* the NULL tail is skipped */
  CHECK(memcmp(copy, out, sizeof(out)) == 0); /* `in` is not changed */
  CHECK(stats_of(pool).in_use == 0);

  CHECK(bufpool_try_acquire_bulk(pool, out, 0) == 0);
  bufpool_release_bulk(pool, out, 0);
  CHECK(bufpool_try_acquire_bulk(pool, out, 5) == 5);
  /* Bulk and single calls mix: one by one back. */
  for (int i = 0; i < 5; ++i) bufpool_release(pool, out[i]);
  out[0] = bufpool_try_acquire(pool);
  REQUIRE(out[0] != NULL);
  bufpool_release_bulk(pool, out, 1);
  CHECK(stats_of(pool).in_use == 0);
  bufpool_destroy(pool);
}

static void test_stats_respect_the_callers_size(void) {
  bufpool_pool* pool = make_pool(4, 64);
  void* b = bufpool_try_acquire(pool);
  REQUIRE(b != NULL);
  unsigned char raw[sizeof(bufpool_stats) + 16];
  bufpool_stats st;

  /* An older caller whose struct ends before acquire_failures. */
  const size_t older = offsetof(bufpool_stats, acquire_failures);
  memset(raw, 0xab, sizeof(raw));
  bufpool_get_stats_sized(pool, (bufpool_stats*)(void*)raw, older);
  memcpy(&st, raw, older);
  CHECK(st.struct_size == older);
  CHECK(st.capacity == 4);
  CHECK(st.in_use == 1);
  for (size_t i = older; i < sizeof(raw); ++i) CHECK(raw[i] == 0xab);

  /* A newer caller with a longer struct: the library fills what it has. */
  memset(raw, 0xab, sizeof(raw));
  bufpool_get_stats_sized(pool, (bufpool_stats*)(void*)raw, sizeof(raw));
  memcpy(&st, raw, sizeof(st));
  CHECK(st.struct_size == sizeof(bufpool_stats));
  CHECK(st.in_use == 1);
  for (size_t i = sizeof(bufpool_stats); i < sizeof(raw); ++i) {
    CHECK(raw[i] == 0xab);
  }
  bufpool_release(pool, b);
  bufpool_destroy(pool);
}

/* An elastic pool through C: the ceiling, growth, trim and their counts; a
 * caller whose struct ends before the elastic fields gets a fixed pool. */
static void test_elastic_pool(void) {
  bufpool_options o = BUFPOOL_OPTIONS_INIT;
  o.buffer_count = 64;
  o.huge_pages = BUFPOOL_HUGE_PAGES_NEVER;
  o.max_buffer_count = 1024;
  o.grow_step = 64;
  char* err = NULL;
  bufpool_pool* pool = bufpool_create(&o, &err);
  REQUIRE(pool != NULL);
  CHECK(bufpool_capacity(pool) == 1024);
  CHECK(stats_of(pool).committed == 64);
  void* out[200];
  CHECK(bufpool_try_acquire_bulk(pool, out, 200) == 200);
  bufpool_stats st = stats_of(pool);
  CHECK(st.committed == 256);
  CHECK(st.grows == 2); /* 64, then 128: steps double through a burst */
  bufpool_release_bulk(pool, out, 200);
  bufpool_flush_caches(pool);
  CHECK(bufpool_trim(pool, 0) > 0);
  st = stats_of(pool);
  CHECK(st.trims == 1);
  CHECK(st.committed == 0);
  CHECK(bufpool_grow(pool, 2048, &err) == 0); /* up to the ceiling */
  CHECK(bufpool_grow(pool, 1, &err) == -1);
  REQUIRE(err != NULL);
  CHECK(contains(err, "ceiling"));
  bufpool_free_error(err);
  bufpool_destroy(pool);

  /* An older struct: the elastic fields are not read. */
  o.struct_size = offsetof(bufpool_options, max_buffer_count);
  err = NULL;
  pool = bufpool_create(&o, &err);
  REQUIRE(pool != NULL);
  CHECK(bufpool_capacity(pool) == 64);
  CHECK(bufpool_trim(pool, 0) == 0);
  bufpool_destroy(pool);
}

/* ---- Abort messages ------------------------------------------------------ */

/* Runs fn in a child with stderr into a pipe; it must die of SIGABRT and
 * have printed `want`. */
static void expect_abort(const char* name, void (*fn)(void), const char* want) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDERR_FILENO);
    fn();
    _exit(0); /* fn should not return */
  }
  close(fds[1]);
  char out[8192];
  size_t len = 0;
  ssize_t r;
  while (len < sizeof(out) - 1 &&
         (r = read(fds[0], out + len, sizeof(out) - 1 - len)) > 0) {
    len += (size_t)r;
  }
  out[len] = '\0';
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT) ||
      !contains(out, want)) {
    fprintf(stderr,
            "%s: want SIGABRT and \"%s\"; got status %#x and stderr:\n%s\n",
            name, want, status, out);
    ++g_failures;
  }
}

static void die_double_release(void) {
  bufpool_pool* pool = make_pool(4, 64);
  void* b = bufpool_try_acquire(pool);
  bufpool_release(pool, b);
  bufpool_release(pool, b);
}

static void die_foreign_pointer(void) {
  bufpool_pool* pool = make_pool(4, 64);
  static char not_ours[4096] __attribute__((aligned(4096)));
  bufpool_release(pool, not_ours);
}

static void die_pointer_inside_a_buffer(void) {
  bufpool_pool* pool = make_pool(4, 64);
  char* b = bufpool_try_acquire(pool);
  bufpool_release(pool, b + 64);
}

static void die_null_release(void) {
  bufpool_pool* pool = make_pool(4, 64);
  bufpool_release(pool, NULL);
}

static void die_other_pools_buffer(void) {
  bufpool_pool* a = make_pool(4, 64);
  bufpool_pool* b = make_pool(4, 64);
  bufpool_release(b, bufpool_try_acquire(a));
}

static void die_bulk_double_release(void) {
  bufpool_pool* pool = make_pool(4, 64);
  void* two[2];
  two[0] = bufpool_try_acquire(pool);
  two[1] = two[0]; /* the same buffer twice in one batch */
  bufpool_release_bulk(pool, two, 2);
}

static void die_bulk_foreign_pointer(void) {
  bufpool_pool* pool = make_pool(4, 64);
  int x = 0;
  void* in[2] = {NULL, &x};
  bufpool_release_bulk(pool, in, 2);
}

static void die_destroy_in_use(void) {
  bufpool_pool* pool = make_pool(4, 64);
  (void)bufpool_try_acquire(pool);
  bufpool_destroy(pool);
}

static void test_release_checks_abort_with_message(void) {
  expect_abort("double release", die_double_release, "double release");
  expect_abort("foreign pointer", die_foreign_pointer, "not from this pool");
  expect_abort("inside a buffer", die_pointer_inside_a_buffer,
               "not from this pool");
  expect_abort("NULL", die_null_release, "not from this pool");
  expect_abort("other pool", die_other_pools_buffer, "not from this pool");
  expect_abort("bulk double release", die_bulk_double_release,
               "double release");
  expect_abort("bulk foreign pointer", die_bulk_foreign_pointer,
               "not from this pool");
  expect_abort("destroy in use", die_destroy_in_use, "still in use");
}

/* ---- 8 threads ----------------------------------------------------------- */

enum { kThreads = 8, kRounds = 20000, kPoolCount = 64 };

/* Each thread passes some buffers to the next one through its mailbox. */
struct mailbox {
  pthread_mutex_t mu;
  void* buffer; /* NULL when empty */
  uint64_t tag; /* what the sender wrote into it */
};

struct shared {
  bufpool_pool* pool;
  struct mailbox boxes[kThreads];
};

struct worker {
  struct shared* shared;
  int id;
  int errors;
};

static void stamp(void* b, uint64_t tag) {
  memcpy(b, &tag, sizeof(tag));
  memcpy((char*)b + 4096 - sizeof(tag), &tag, sizeof(tag));
}

static int stamped(const void* b, uint64_t tag) {
  uint64_t head, tail;
  memcpy(&head, b, sizeof(head));
  memcpy(&tail, (const char*)b + 4096 - sizeof(tail), sizeof(tail));
  return head == tag && tail == tag;
}

static void* work(void* arg) {
  struct worker* w = arg;
  struct shared* s = w->shared;
  bufpool_pool* pool = s->pool;
  for (uint64_t round = 0; round < kRounds; ++round) {
    const uint64_t tag = ((uint64_t)w->id << 32) | round;
    /* The pair. */
    void* b = bufpool_try_acquire(pool);
    if (b != NULL) {
      stamp(b, tag);
      if (!stamped(b, tag)) ++w->errors;
      bufpool_release(pool, b);
    }
    /* A batch. */
    if (round % 8 == 0) {
      void* batch[4];
      const size_t n = bufpool_try_acquire_bulk(pool, batch, 4);
      for (size_t i = 0; i < n; ++i) stamp(batch[i], tag + i);
      for (size_t i = 0; i < n; ++i) {
        if (!stamped(batch[i], tag + i)) ++w->errors;
      }
      bufpool_release_bulk(pool, batch, 4);
    }
    /* A wait (never forever: a lost wake-up fails instead of hanging). */
    if (round % 64 == 0) {
      char* err = NULL;
      void* waited = bufpool_acquire(pool, 60 * 1000000000LL, &err);
      if (waited == NULL) {
        fprintf(stderr, "thread %d: %s\n", w->id, err);
        bufpool_free_error(err);
        ++w->errors;
      } else {
        stamp(waited, tag);
        /* Hand it to the next thread, which releases it. */
        struct mailbox* out = &s->boxes[(w->id + 1) % kThreads];
        pthread_mutex_lock(&out->mu);
        void* old = out->buffer;
        const uint64_t old_tag = out->tag;
        out->buffer = waited;
        out->tag = tag;
        pthread_mutex_unlock(&out->mu);
        if (old != NULL) {
          if (!stamped(old, old_tag)) ++w->errors;
          bufpool_release(pool, old);
        }
      }
    }
    /* Take what the previous thread handed over. */
    if (round % 16 == 0) {
      struct mailbox* in = &s->boxes[w->id];
      pthread_mutex_lock(&in->mu);
      void* got = in->buffer;
      const uint64_t got_tag = in->tag;
      in->buffer = NULL;
      pthread_mutex_unlock(&in->mu);
      if (got != NULL) {
        if (!stamped(got, got_tag)) ++w->errors;
        bufpool_release(pool, got);
      }
    }
    if (round % 256 == 0) {
      bufpool_stats st;
      bufpool_get_stats(pool, &st);
      if (st.in_use > kPoolCount || st.capacity != kPoolCount) ++w->errors;
      void* base;
      size_t len;
      bufpool_region(pool, &base, &len);
      if (len != (size_t)kPoolCount * 4096) ++w->errors;
    }
  }
  return NULL;
}

/* The metrics text, snprintf-style: the length of the whole, a truncated
 * copy with a NUL, the pool's numbers and label. */
static void test_write_metrics(void) {
  bufpool_pool* pool = make_pool(16, 0);
  void* held = bufpool_try_acquire(pool);
  REQUIRE(held != NULL);
  const size_t need = bufpool_write_metrics(pool, "rx", NULL, 0);
  CHECK(need > 100);
  char small[16];
  CHECK(bufpool_write_metrics(pool, "rx", small, sizeof(small)) == need);
  CHECK(strlen(small) == sizeof(small) - 1);
  char* text = malloc(need + 1);
  REQUIRE(text != NULL);
  CHECK(bufpool_write_metrics(pool, "rx", text, need + 1) == need);
  CHECK(strlen(text) == need);
  CHECK(contains(text, "bufpool_pool_buffers{pool=\"rx\",state=\"in_use\"} 1\n"));
  CHECK(contains(text, "bufpool_pool_capacity_buffers{pool=\"rx\"} 16\n"));
  CHECK(contains(text, "# TYPE bufpool_pool_acquire_failures_total counter\n"));
  free(text);
  bufpool_release(pool, held);
  bufpool_destroy(pool);
}

/* Keeps one raw buffer: the leak the report names. */
__attribute__((noinline)) static void* plant_leak(bufpool_pool* pool) {
  void* p = bufpool_try_acquire(pool);
  __asm__ volatile("" ::: "memory"); /* not a tail call: this frame stays */
  return p;
}

/* The holders report, snprintf-style, names the acquiring function with
 * tracking on; a caller's struct that ends before track_holders gets the
 * default (off), whose report says how to turn it on. */
static void test_holders_report(void) {
  bufpool_options o = BUFPOOL_OPTIONS_INIT;
  o.buffer_count = 16;
  o.track_holders = BUFPOOL_TRACK_HOLDERS_ALL;
  char* err = NULL;
  bufpool_pool* pool = bufpool_create(&o, &err);
  REQUIRE(pool != NULL);
  void* held = plant_leak(pool);
  REQUIRE(held != NULL);
  /* The text names the holder's age, whose width may change between calls
   * ("<1ms", "9ms", "10ms" in a slow sanitized run): lengths are compared
   * with room for that. */
  const size_t need = bufpool_holders_report(pool, 20, NULL, 0);
  REQUIRE(need > 8);
  char small[8];
  const size_t whole = bufpool_holders_report(pool, 20, small, sizeof(small));
  CHECK(whole + 16 >= need && whole <= need + 16);
  CHECK(strlen(small) == sizeof(small) - 1);
  char* text = malloc(need + 64);
  REQUIRE(text != NULL);
  const size_t got = bufpool_holders_report(pool, 20, text, need + 64);
  CHECK(got + 16 >= need && got < need + 64);
  CHECK(strlen(text) == got);
  CHECK(contains(text, "1 of 16 buffer(s) out (tracking all): 1 raw pointer"));
  CHECK(contains(text, "plant_leak"));
  free(text);
  bufpool_release(pool, held);
  bufpool_destroy(pool);

  o.struct_size = offsetof(bufpool_options, track_holders);
  pool = bufpool_create(&o, &err);
  REQUIRE(pool != NULL);
  held = bufpool_try_acquire(pool);
  char line[512];
  bufpool_holders_report(pool, 20, line, sizeof(line));
  if (getenv("BUFPOOL_TRACK_HOLDERS") == NULL) {
    CHECK(contains(line, "BUFPOOL_TRACK_HOLDERS=all"));
  }
  bufpool_release(pool, held);
  bufpool_destroy(pool);
}

static void test_eight_threads(void) {
  struct shared s;
  s.pool = make_pool(kPoolCount, 64);
  for (int i = 0; i < kThreads; ++i) {
    pthread_mutex_init(&s.boxes[i].mu, NULL);
    s.boxes[i].buffer = NULL;
    s.boxes[i].tag = 0;
  }
  struct worker workers[kThreads];
  pthread_t threads[kThreads];
  for (int i = 0; i < kThreads; ++i) {
    workers[i] = (struct worker){&s, i, 0};
    REQUIRE(pthread_create(&threads[i], NULL, work, &workers[i]) == 0);
  }
  for (int i = 0; i < kThreads; ++i) {
    REQUIRE(pthread_join(threads[i], NULL) == 0);
    CHECK(workers[i].errors == 0);
  }
  for (int i = 0; i < kThreads; ++i) {
    if (s.boxes[i].buffer != NULL) {
      CHECK(stamped(s.boxes[i].buffer, s.boxes[i].tag));
      bufpool_release(s.pool, s.boxes[i].buffer);
    }
    pthread_mutex_destroy(&s.boxes[i].mu);
  }
  bufpool_stats st = stats_of(s.pool);
  CHECK(st.in_use == 0);
  CHECK(st.high_water >= 1 && st.high_water <= kPoolCount);
  /* Every thread has exited, so every buffer is reachable again. */
  void* all[kPoolCount];
  CHECK(bufpool_try_acquire_bulk(s.pool, all, kPoolCount) == kPoolCount);
  bufpool_release_bulk(s.pool, all, kPoolCount);
  bufpool_destroy(s.pool);
}

/* ---- Budgets ------------------------------------------------------------- */

static void test_budget_options_defaults(void) {
  const bufpool_budget_options macro = BUFPOOL_BUDGET_OPTIONS_INIT;
  bufpool_budget_options fn;
  memset(&fn, 0xab, sizeof(fn));
  bufpool_budget_options_init(&fn, sizeof(fn));
  CHECK(memcmp(&macro, &fn, sizeof(fn)) == 0);
  CHECK(macro.struct_size == sizeof(bufpool_budget_options));
  CHECK(macro.name == NULL);
  CHECK(macro.max_bytes == 0); /* no default: the caller sets it */
  CHECK(macro.high_watermark == 0 && macro.low_watermark == 0);
  CHECK(macro.on_high == NULL && macro.on_low == NULL);
  CHECK(macro.user_data == NULL);
  CHECK(macro.reserved_bytes == 0);
  CHECK(macro.group == NULL);
}

/* Creates a budget that must be refused; returns the error (the caller's). */
static char* refused_budget(bufpool_pool* pool,
                            const bufpool_budget_options* o) {
  char* err = NULL;
  bufpool_budget* b = bufpool_budget_create(pool, o, &err);
  CHECK(b == NULL);
  if (b != NULL) bufpool_budget_destroy(b);
  CHECK(err != NULL);
  return err;
}

/* Bad options: one error each, naming the field and its numbers; nothing is
 * taken from the pool. */
static void test_budget_create_errors(void) {
  bufpool_pool* pool = make_pool(16, 0);
  bufpool_budget_options o = BUFPOOL_BUDGET_OPTIONS_INIT;
  o.name = "conn 1";
  char* err = refused_budget(pool, &o); /* max_bytes left at 0 */
  CHECK(contains(err, "INVALID_ARGUMENT"));
  CHECK(contains(err, "\"conn 1\""));
  CHECK(contains(err, "max_bytes 0 is less than one buffer (4096 bytes)"));
  bufpool_free_error(err);

  o.max_bytes = 8 * 4096;
  o.high_watermark = 2 * 4096;
  o.low_watermark = 4 * 4096; /* above the high one */
  err = refused_budget(pool, &o);
  CHECK(contains(err, "INVALID_ARGUMENT"));
  CHECK(contains(err, "low < high <= max_bytes (low 16384, high 8192"));
  bufpool_free_error(err);

  o.high_watermark = 9 * 4096; /* above max_bytes */
  err = refused_budget(pool, &o);
  CHECK(contains(err, "high 36864, max_bytes 32768"));
  bufpool_free_error(err);

  o.high_watermark = 0;
  o.low_watermark = 4096; /* a low mark alone */
  err = refused_budget(pool, &o);
  CHECK(contains(err, "low_watermark 4096 without a high_watermark"));
  bufpool_free_error(err);

  o.low_watermark = 0;
  o.reserved_bytes = 9 * 4096; /* more than max_bytes */
  err = refused_budget(pool, &o);
  CHECK(contains(err, "reserved_bytes 36864 exceeds max_bytes 32768"));
  bufpool_free_error(err);

  o.max_bytes = 64 * 4096;
  o.reserved_bytes = 17 * 4096; /* more than the pool's 16 buffers */
  err = refused_budget(pool, &o);
  CHECK(contains(err, "RESOURCE_EXHAUSTED"));
  CHECK(contains(err,
                 "reserving 17 buffers would over-commit the pool (16 "
                 "buffers"));
  bufpool_free_error(err);

  /* Reservations add up: 10 then 7 of 16. */
  o.reserved_bytes = 10 * 4096;
  err = NULL;
  bufpool_budget* ten = bufpool_budget_create(pool, &o, &err);
  REQUIRE(ten != NULL);
  CHECK(err == NULL);
  o.reserved_bytes = 7 * 4096;
  err = refused_budget(pool, &o);
  CHECK(contains(err,
                 "reserving 7 buffers would over-commit the pool (16 "
                 "buffers, 10 reserved by budgets"));
  bufpool_free_error(err);
  bufpool_budget_destroy(ten);

  err = refused_budget(pool, NULL);
  CHECK(contains(err, "options is NULL"));
  bufpool_free_error(err);
  o.struct_size = offsetof(bufpool_budget_options, reserved_bytes);
  err = refused_budget(pool, &o);
  CHECK(contains(err, "struct_size"));
  bufpool_free_error(err);
  o.struct_size = sizeof(o) + 8;
  err = refused_budget(pool, &o);
  CHECK(contains(err, "newer bufpool/c.h"));
  bufpool_free_error(err);
  CHECK(bufpool_budget_create(pool, NULL, NULL) == NULL); /* err may be NULL */

  const bufpool_stats st = stats_of(pool);
  CHECK(st.in_use == 0); /* every refused reserve went back */
  bufpool_destroy(pool);
}

struct marks {
  int highs, lows;
};
static void on_high(void* user_data) { ++((struct marks*)user_data)->highs; }
static void on_low(void* user_data) { ++((struct marks*)user_data)->lows; }

static bufpool_budget_stats budget_stats_of(const bufpool_budget* b) {
  bufpool_budget_stats st;
  memset(&st, 0xab, sizeof(st));
  bufpool_budget_get_stats(b, &st);
  CHECK(st.struct_size == sizeof(st));
  return st;
}

/* The limit refuses with a message naming the budget, taking nothing; the
 * watermarks fire once each way, with the caller's user_data; the stats and
 * the pool's metrics show the budget. */
static void test_budget_limit_and_watermarks(void) {
  bufpool_pool* pool = make_pool(16, 0);
  struct marks m = {0, 0};
  bufpool_budget_options o = BUFPOOL_BUDGET_OPTIONS_INIT;
  o.name = "conn 7";
  o.max_bytes = 4 * 4096 + 100; /* rounded down to 4 buffers */
  o.high_watermark = 3 * 4096;
  o.low_watermark = 1 * 4096;
  o.on_high = on_high;
  o.on_low = on_low;
  o.user_data = &m;
  char* err = NULL;
  bufpool_budget* budget = bufpool_budget_create(pool, &o, &err);
  REQUIRE(budget != NULL);
  char name[4];
  CHECK(bufpool_budget_name(budget, name, sizeof(name)) == 6);
  CHECK(strcmp(name, "con") == 0);

  void* got[4];
  for (int i = 0; i < 4; ++i) {
    got[i] = bufpool_budget_acquire(budget, &err);
    REQUIRE(got[i] != NULL);
    memset(got[i], i, 4096);            /* a whole buffer, writable */
    CHECK(m.highs == (i >= 2 ? 1 : 0)); /* at 3 buffers, once */
  }
  CHECK(err == NULL);
  CHECK(bufpool_budget_acquire(budget, &err) == NULL);
  CHECK(contains(err,
                 "RESOURCE_EXHAUSTED: bufpool_budget_acquire: budget "
                 "\"conn 7\" is at its limit of 16384 bytes"));
  CHECK(contains(err, "no buffer taken"));
  CHECK(bufpool_budget_acquire(budget, NULL) == NULL); /* err may be NULL */
  bufpool_free_error(err);
  err = NULL;
  CHECK(stats_of(pool).in_use == 4); /* the refusals took nothing */

  bufpool_budget_stats st = budget_stats_of(budget);
  CHECK(st.pinned_bytes == 4 * 4096);
  CHECK(st.high_water_bytes == 4 * 4096);
  CHECK(st.refusals == 2);
  CHECK(st.max_bytes == 4 * 4096);
  CHECK(st.reserve_buffers == 0);

  const size_t need = bufpool_write_metrics(pool, "", NULL, 0);
  char* text = malloc(need + 1);
  REQUIRE(text != NULL);
  bufpool_write_metrics(pool, "", text, need + 1);
  CHECK(
      contains(text, "bufpool_budget_pinned_bytes{budget=\"conn 7\"} 16384\n"));
  CHECK(contains(text, "bufpool_budget_refusals_total{budget=\"conn 7\"} 2\n"));
  free(text);

  bufpool_budget_release(budget, got[3]);
  bufpool_budget_release(budget, got[2]);
  CHECK(m.lows == 0); /* 2 buffers: above the low mark */
  bufpool_budget_release(budget, got[1]);
  CHECK(m.lows == 1 && m.highs == 1);
  got[1] = bufpool_budget_acquire(budget, &err);
  got[2] = bufpool_budget_acquire(budget, &err);
  REQUIRE(got[1] != NULL && got[2] != NULL);
  CHECK(m.highs == 2); /* armed again by the low crossing */
  bufpool_budget_release(budget, got[2]);
  bufpool_budget_release(budget, got[1]);
  bufpool_budget_release(budget, got[0]);
  CHECK(m.lows == 2);
  st = budget_stats_of(budget);
  CHECK(st.pinned_bytes == 0);
  CHECK(st.high_water_bytes == 4 * 4096);
  CHECK(stats_of(pool).in_use == 0);
  bufpool_budget_destroy(budget);
  bufpool_budget_destroy(NULL); /* ignored */
  bufpool_destroy(pool);
}

/* A reservation is there after another consumer drained the pool, and is
 * refilled when its buffers come back; past it, a dry pool is its own
 * error, not a refusal. */
static void test_budget_reservation_survives_a_drained_pool(void) {
  bufpool_pool* pool = make_pool(8, 0);
  bufpool_budget_options o = BUFPOOL_BUDGET_OPTIONS_INIT;
  o.name = "reply";
  o.max_bytes = 4 * 4096;
  o.reserved_bytes = 4096 + 1; /* rounded up to 2 buffers */
  char* err = NULL;
  bufpool_budget* budget = bufpool_budget_create(pool, &o, &err);
  REQUIRE(budget != NULL);
  CHECK(budget_stats_of(budget).reserve_buffers == 2);
  CHECK(stats_of(pool).in_use == 2);

  void* others[8];
  CHECK(bufpool_try_acquire_bulk(pool, others, 8) == 6); /* the rest */
  void* a = bufpool_budget_acquire(budget, &err);
  void* b = bufpool_budget_acquire(budget, &err);
  CHECK(a != NULL && b != NULL && a != b);
  CHECK(err == NULL);
  CHECK(budget_stats_of(budget).reserve_buffers == 0);
  CHECK(bufpool_budget_acquire(budget, &err) == NULL);
  CHECK(contains(err,
                 "the pool has no free buffer (budget \"reply\" pins "
                 "8192 of its 16384 bytes)"));
  bufpool_free_error(err);
  err = NULL;
  CHECK(budget_stats_of(budget).refusals == 0); /* the pool's, not its own */

  bufpool_budget_release(budget, a); /* back into the reserve */
  CHECK(budget_stats_of(budget).reserve_buffers == 1);
  a = bufpool_budget_acquire(budget, &err); /* the pool is still dry */
  CHECK(a != NULL);
  bufpool_budget_release(budget, a);
  bufpool_budget_release(budget, b);
  CHECK(budget_stats_of(budget).reserve_buffers == 2);
  bufpool_release_bulk(pool, others, 6);
  CHECK(stats_of(pool).in_use == 2);
  bufpool_budget_destroy(budget);
  CHECK(stats_of(pool).in_use == 0);
  bufpool_destroy(pool);
}

static void die_budget_release_unacquired(void) {
  bufpool_pool* pool = make_pool(4, 64);
  bufpool_budget_options o = BUFPOOL_BUDGET_OPTIONS_INIT;
  o.name = "b";
  o.max_bytes = 4096;
  bufpool_budget* budget = bufpool_budget_create(pool, &o, NULL);
  bufpool_budget_release(budget, bufpool_try_acquire(pool));
}

static void die_budget_destroy_in_use(void) {
  bufpool_pool* pool = make_pool(4, 64);
  bufpool_budget_options o = BUFPOOL_BUDGET_OPTIONS_INIT;
  o.name = "b";
  o.max_bytes = 4096;
  bufpool_budget* budget = bufpool_budget_create(pool, &o, NULL);
  (void)bufpool_budget_acquire(budget, NULL);
  bufpool_budget_destroy(budget);
}

static void die_budget_double_release(void) {
  bufpool_pool* pool = make_pool(4, 64);
  bufpool_budget_options o = BUFPOOL_BUDGET_OPTIONS_INIT;
  o.name = "b";
  o.max_bytes = 2 * 4096;
  bufpool_budget* budget = bufpool_budget_create(pool, &o, NULL);
  void* p = bufpool_budget_acquire(budget, NULL);
  (void)bufpool_budget_acquire(budget, NULL);
  bufpool_budget_release(budget, p);
  bufpool_budget_release(budget, p);
}

static void test_budget_misuse_aborts_with_message(void) {
  expect_abort("budget release unacquired", die_budget_release_unacquired,
               "budget \"b\" released more than it acquired");
  expect_abort("budget destroy in use", die_budget_destroy_in_use,
               "budget \"b\" destroyed while it pins 4096 bytes");
  expect_abort("budget double release", die_budget_double_release,
               "double release");
}

/* A shared pool: joined in a forked child, a buffer handed back by token,
 * refused tokens, and a child that dies holding buffers. */
static void test_shared_pool(void) {
#if defined(__SANITIZE_THREAD__)
  /* A pool joined in a fork() child of a process with a pool: TSan reads
     the fork handler's re-initialised gate as a lock-order inversion (see
     shared_pool_test.cc); the default and ASan builds run this. */
  return;
#endif
  bufpool_options o = BUFPOOL_OPTIONS_INIT;
  o.buffer_count = 32;
  o.cache_size = 4;
  o.shared = 1;
  char* err = NULL;
  bufpool_pool* pool = bufpool_create(&o, &err);
  REQUIRE(pool != NULL);
  const int fd = bufpool_shared_fd(pool);
  CHECK(fd >= 0);
  CHECK(stats_of(pool).processes == 1);
  int p[2];
  REQUIRE(pipe(p) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(p[0]);
    bufpool_pool* joined = bufpool_join(fd, NULL);
    if (joined == NULL) _exit(2);
    void* b = bufpool_try_acquire(joined);
    if (b == NULL) _exit(3);
    strcpy((char*)b, "from C");
    const uint64_t t = bufpool_export(joined, b);
    for (int i = 0; i < 5; ++i) (void)bufpool_try_acquire(joined);
    if (write(p[1], &t, sizeof(t)) != (ssize_t)sizeof(t)) _exit(4);
    _exit(0); /* dies holding 5 buffers and its caches */
  }
  close(p[1]);
  uint64_t token = 0;
  REQUIRE(read(p[0], &token, sizeof(token)) == (ssize_t)sizeof(token));
  close(p[0]);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(token != 0);
  void* got = bufpool_import(pool, token, &err);
  REQUIRE(got != NULL);
  CHECK(strcmp((const char*)got, "from C") == 0);
  CHECK(bufpool_import(pool, token, &err) == NULL); /* twice */
  CHECK(contains(err, "FAILED_PRECONDITION"));
  CHECK(bufpool_import(pool, 0, &err) == NULL); /* forged */
  CHECK(contains(err, "INVALID_ARGUMENT"));
  bufpool_free_error(err);
  err = NULL;
  CHECK(bufpool_reclaim_dead(pool) >= 5);
  const bufpool_stats st = stats_of(pool);
  CHECK(st.reclaimed >= 5);
  CHECK(st.processes == 1);
  bufpool_release(pool, got);
  CHECK(bufpool_join(-1, &err) == NULL);
  CHECK(contains(err, "INVALID_ARGUMENT: BufferPool::Join(fd -1)"));
  bufpool_free_error(err);
  /* Every buffer is back. */
  void* all[32];
  CHECK(bufpool_try_acquire_bulk(pool, all, 32) == 32);
  bufpool_release_bulk(pool, all, 32);
  bufpool_destroy(pool);
}

/* ---- Driver -------------------------------------------------------------- */

static const struct {
  const char* name;
  void (*fn)(void);
} kTests[] = {
    {"options_defaults", test_options_defaults},
    {"elastic_pool", test_elastic_pool},
    {"create_reports_geometry", test_create_reports_geometry},
    {"create_errors_name_field_and_value",
     test_create_errors_name_field_and_value},
    {"try_acquire_until_empty", test_try_acquire_until_empty},
    {"options_reach_the_pool", test_options_reach_the_pool},
    {"acquire_times_out_with_error", test_acquire_times_out_with_error},
    {"acquire_waits_for_a_release", test_acquire_waits_for_a_release},
    {"bulk_calls", test_bulk_calls},
    {"stats_respect_the_callers_size", test_stats_respect_the_callers_size},
    {"release_checks_abort_with_message",
     test_release_checks_abort_with_message},
    {"eight_threads", test_eight_threads},
    {"write_metrics", test_write_metrics},
    {"holders_report", test_holders_report},
    {"budget_options_defaults", test_budget_options_defaults},
    {"budget_create_errors", test_budget_create_errors},
    {"budget_limit_and_watermarks", test_budget_limit_and_watermarks},
    {"budget_reservation_survives_a_drained_pool",
     test_budget_reservation_survives_a_drained_pool},
    {"budget_misuse_aborts_with_message",
     test_budget_misuse_aborts_with_message},
    {"shared_pool", test_shared_pool},
};

int main(int argc, char** argv) {
  const size_t n = sizeof(kTests) / sizeof(kTests[0]);
  int ran = 0;
  for (size_t i = 0; i < n; ++i) {
    int wanted = argc == 1;
    for (int a = 1; a < argc; ++a)
      wanted |= strcmp(argv[a], kTests[i].name) == 0;
    if (!wanted) continue;
    const int before = g_failures;
    kTests[i].fn();
    printf("%s %s\n", g_failures == before ? "ok  " : "FAIL", kTests[i].name);
    ++ran;
  }
  if (ran == 0 || ran < argc - 1) {
    fprintf(stderr, "c_api_test: unknown test name\n");
    return 2;
  }
  return g_failures == 0 ? 0 : 1;
}
