// The C API (include/bufpool/c.h): a thin shell over bufpool::BufferPool.
//
// A bufpool_pool* is the BufferPool* itself, cast, so the hot calls reach
// the C++ inline fast paths (TryAcquireRaw/ReleaseRaw) with no load in
// between: bufpool_try_acquire() and bufpool_release() compile to the
// C++ raw pair plus one call. Nothing but C types crosses: errors become
// malloc()ed strings, and every entry point is noexcept, so a C++ exception
// that is not turned into an error terminates instead of unwinding into C
// frames (create and acquire, the calls that return errors, catch them).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/c.h"
#include "bufpool/metrics.h"
#include "c_internal.h"

namespace {

using bufpool::BufferPool;

// The C defaults are the C++ ones.
constexpr bufpool_options kCDefaults = BUFPOOL_OPTIONS_INIT;
constexpr bufpool::PoolOptions kCppDefaults;
static_assert(kCDefaults.struct_size == sizeof(bufpool_options));
static_assert(kCDefaults.buffer_size == kCppDefaults.buffer_size);
static_assert(kCDefaults.buffer_count == kCppDefaults.buffer_count);
static_assert(kCDefaults.huge_pages ==
              static_cast<int>(kCppDefaults.huge_pages));
static_assert(kCDefaults.populate == kCppDefaults.populate);
static_assert(kCDefaults.lock_memory == kCppDefaults.lock_memory);
static_assert(kCDefaults.scrub_on_release == kCppDefaults.scrub_on_release);
static_assert(kCDefaults.cache_size == kCppDefaults.cache_size);
static_assert(kCDefaults.max_buffer_count == kCppDefaults.max_buffer_count);
static_assert(kCDefaults.grow_step == kCppDefaults.grow_step);
static_assert(kCDefaults.trim_after_idle_ns == 0 &&
              kCppDefaults.trim_after_idle == absl::ZeroDuration());
static_assert(kCDefaults.track_holders ==
              static_cast<int>(kCppDefaults.track_holders));
static_assert(kCDefaults.holder_sample_every ==
              kCppDefaults.holder_sample_every);
static_assert(kCDefaults.shared == kCppDefaults.shared);
static_assert(BUFPOOL_TRACK_HOLDERS_OFF ==
              static_cast<int>(bufpool::TrackHolders::kOff));
static_assert(BUFPOOL_TRACK_HOLDERS_SAMPLED ==
              static_cast<int>(bufpool::TrackHolders::kSampled));
static_assert(BUFPOOL_TRACK_HOLDERS_ALL ==
              static_cast<int>(bufpool::TrackHolders::kAll));
static_assert(BUFPOOL_HUGE_PAGES_NEVER ==
              static_cast<int>(bufpool::HugePages::kNever));
static_assert(BUFPOOL_HUGE_PAGES_TRY ==
              static_cast<int>(bufpool::HugePages::kTry));
static_assert(BUFPOOL_HUGE_PAGES_REQUIRE ==
              static_cast<int>(bufpool::HugePages::kRequire));

// The size of the first bufpool_options: the end of cache_size (named
// thread_cache_size in 0.2, same place and size), its last field. Fields added
// later go after it, and those past what a caller's struct_size covers keep
// their defaults.
constexpr size_t kOptionsV1Size =
    offsetof(bufpool_options, cache_size) + sizeof(size_t);

BufferPool* Pool(bufpool_pool* p) { return reinterpret_cast<BufferPool*>(p); }
const BufferPool* Pool(const bufpool_pool* p) {
  return reinterpret_cast<const BufferPool*>(p);
}

// Options in C++ form, or the error naming the field.
absl::Status ToPoolOptions(const bufpool_options* in,
                           bufpool::PoolOptions* out) {
  if (in == nullptr) return absl::OkStatus();
  if (in->struct_size < kOptionsV1Size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bufpool_create: bufpool_options.struct_size is ", in->struct_size,
        ", less than the ", kOptionsV1Size,
        " bytes of the first version (start from BUFPOOL_OPTIONS_INIT)"));
  }
  if (in->struct_size > sizeof(bufpool_options)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bufpool_create: bufpool_options.struct_size is ", in->struct_size,
        ", more than the ", sizeof(bufpool_options),
        " bytes this library knows (built against a newer bufpool/c.h?)"));
  }
  switch (in->huge_pages) {
    case BUFPOOL_HUGE_PAGES_NEVER:
    case BUFPOOL_HUGE_PAGES_TRY:
    case BUFPOOL_HUGE_PAGES_REQUIRE:
      out->huge_pages = static_cast<bufpool::HugePages>(in->huge_pages);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "bufpool_create: bufpool_options.huge_pages is ", in->huge_pages,
          "; use BUFPOOL_HUGE_PAGES_NEVER (0), BUFPOOL_HUGE_PAGES_TRY (1) or "
          "BUFPOOL_HUGE_PAGES_REQUIRE (2)"));
  }
  out->buffer_size = in->buffer_size;
  out->buffer_count = in->buffer_count;
  out->populate = in->populate != 0;
  out->lock_memory = in->lock_memory != 0;
  out->scrub_on_release = in->scrub_on_release != 0;
  out->cache_size = in->cache_size;
  // The elastic fields (0.3), where the caller's struct has them.
  auto has = [in](size_t offset, size_t size) {
    return in->struct_size >= offset + size;
  };
  if (has(offsetof(bufpool_options, max_buffer_count), sizeof(size_t))) {
    out->max_buffer_count = in->max_buffer_count;
  }
  if (has(offsetof(bufpool_options, grow_step), sizeof(size_t))) {
    out->grow_step = in->grow_step;
  }
  if (has(offsetof(bufpool_options, trim_after_idle_ns), sizeof(int64_t))) {
    out->trim_after_idle = absl::Nanoseconds(in->trim_after_idle_ns);
  }
  // Since 0.3: read only where the caller's struct has them.
  if (in->struct_size >=
      offsetof(bufpool_options, track_holders) + sizeof(int)) {
    switch (in->track_holders) {
      case BUFPOOL_TRACK_HOLDERS_OFF:
      case BUFPOOL_TRACK_HOLDERS_SAMPLED:
      case BUFPOOL_TRACK_HOLDERS_ALL:
        out->track_holders =
            static_cast<bufpool::TrackHolders>(in->track_holders);
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("bufpool_create: bufpool_options.track_holders is ",
                         in->track_holders,
                         "; use BUFPOOL_TRACK_HOLDERS_OFF (0), "
                         "BUFPOOL_TRACK_HOLDERS_SAMPLED "
                         "(1) or BUFPOOL_TRACK_HOLDERS_ALL (2)"));
    }
  }
  if (in->struct_size >=
      offsetof(bufpool_options, holder_sample_every) + sizeof(uint32_t)) {
    out->holder_sample_every = in->holder_sample_every;
  }
  // Since 0.4.
  if (has(offsetof(bufpool_options, shared), sizeof(int))) {
    out->shared = in->shared != 0;
  }
  return absl::OkStatus();
}

}  // namespace

namespace bufpool::c_internal {

// Stored when even the message cannot be allocated; bufpool_free_error()
// knows not to free it.
char kNoMemoryError[] =
    "RESOURCE_EXHAUSTED: bufpool: out of memory for the error message";

// LevelDB's convention (see c.h): free what *err held, then store.
void StoreError(char** err, std::string_view message) {
  if (err == nullptr) return;
  bufpool_free_error(*err);
  char* s = static_cast<char*>(std::malloc(message.size() + 1));
  if (s == nullptr) {
    *err = kNoMemoryError;
    return;
  }
  std::memcpy(s, message.data(), message.size());
  s[message.size()] = '\0';
  *err = s;
}

void StoreError(char** err, const absl::Status& status) {
  StoreError(err, status.ToString());
}

size_t CopyOut(std::string_view text, char* buf, size_t size) {
  if (size != 0) {
    const size_t n = std::min(text.size(), size - 1);
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return text.size();
}

}  // namespace bufpool::c_internal

using bufpool::c_internal::CopyOut;
using bufpool::c_internal::kNoMemoryError;
using bufpool::c_internal::StoreError;

extern "C" {

void bufpool_options_init(bufpool_options* options,
                          size_t options_size) noexcept {
  bufpool_options defaults = BUFPOOL_OPTIONS_INIT;
  defaults.struct_size = options_size;
  std::memcpy(options, &defaults, std::min(options_size, sizeof(defaults)));
}

bufpool_pool* bufpool_create(const bufpool_options* options,
                             char** err) noexcept {
  try {
    bufpool::PoolOptions cpp;
    if (absl::Status s = ToPoolOptions(options, &cpp); !s.ok()) {
      StoreError(err, s);
      return nullptr;
    }
    absl::StatusOr<std::unique_ptr<BufferPool>> pool = BufferPool::Create(cpp);
    if (!pool.ok()) {
      StoreError(err, pool.status());
      return nullptr;
    }
    return reinterpret_cast<bufpool_pool*>(pool->release());
  } catch (const std::exception& e) {
    StoreError(err,
               absl::StrCat("RESOURCE_EXHAUSTED: bufpool_create: ", e.what()));
  } catch (...) {
    StoreError(err, "UNKNOWN: bufpool_create: unknown C++ exception");
  }
  return nullptr;
}

void bufpool_destroy(bufpool_pool* pool) noexcept { delete Pool(pool); }

void bufpool_free_error(char* err) noexcept {
  if (err != kNoMemoryError) std::free(err);
}

void* bufpool_try_acquire(bufpool_pool* pool) noexcept {
  return Pool(pool)->TryAcquireRaw();
}

void* bufpool_acquire(bufpool_pool* pool, int64_t timeout_ns,
                      char** err) noexcept {
  try {
    absl::StatusOr<bufpool::Buffer> b =
        Pool(pool)->Acquire(absl::Nanoseconds(timeout_ns));
    if (!b.ok()) {
      StoreError(err, b.status());
      return nullptr;
    }
    return b->Detach();  // now out as a raw pointer, released as one
  } catch (const std::exception& e) {
    StoreError(err, absl::StrCat("UNKNOWN: bufpool_acquire: ", e.what()));
  } catch (...) {
    StoreError(err, "UNKNOWN: bufpool_acquire: unknown C++ exception");
  }
  return nullptr;
}

void bufpool_release(bufpool_pool* pool, void* buffer) noexcept {
  Pool(pool)->ReleaseRaw(static_cast<std::byte*>(buffer));
}

// void* and std::byte* have the same representation; the C caller's array
// is only read and written through the C++ calls.
size_t bufpool_try_acquire_bulk(bufpool_pool* pool, void** out,
                                size_t n) noexcept {
  return Pool(pool)->TryAcquireRawBulk({reinterpret_cast<std::byte**>(out), n});
}

void bufpool_release_bulk(bufpool_pool* pool, void* const* in,
                          size_t n) noexcept {
  Pool(pool)->ReleaseRawBulk({reinterpret_cast<std::byte* const*>(in), n});
}

int bufpool_notify_when_free(bufpool_pool* pool, int event_fd,
                             char** err) noexcept {
  const absl::Status s = Pool(pool)->NotifyWhenFree(event_fd);
  if (s.ok()) return 0;
  StoreError(err, s);
  return -1;
}

size_t bufpool_write_metrics(const bufpool_pool* pool, const char* name,
                             char* buf, size_t size) noexcept {
  std::string text;
  try {
    bufpool::WriteMetrics(*Pool(pool), &text,
                          {.name = name != nullptr ? name : ""});
  } catch (const std::bad_alloc&) {
    return 0;
  }
  return CopyOut(text, buf, size);
}

size_t bufpool_holders_report(const bufpool_pool* pool, size_t max_holders,
                              char* buf, size_t size) noexcept {
  std::string text;
  try {
    text = Pool(pool)->HoldersReport(max_holders);
  } catch (const std::bad_alloc&) {
    return 0;
  }
  return CopyOut(text, buf, size);
}

void bufpool_flush_caches(bufpool_pool* pool) noexcept {
  Pool(pool)->FlushCaches();
}

void bufpool_get_stats_sized(const bufpool_pool* pool, bufpool_stats* stats,
                             size_t stats_size) noexcept {
  const bufpool::PoolStats s = Pool(pool)->Stats();
  bufpool_stats out;
  std::memset(&out, 0, sizeof(out));
  out.capacity = s.capacity;
  out.in_use = s.in_use;
  out.high_water = s.high_water;
  out.acquire_failures = s.acquire_failures;
  out.acquire_timeouts = s.acquire_timeouts;
  out.cached = s.cached;
  out.committed = s.committed;
  out.grows = s.grows;
  out.trims = s.trims;
  out.grow_failures = s.grow_failures;
  out.processes = s.processes;
  out.reclaimed = s.reclaimed;
  const size_t n = std::min(stats_size, sizeof(out));
  out.struct_size = n;
  std::memcpy(stats, &out, n);
}

int bufpool_shared_fd(const bufpool_pool* pool) noexcept {
  return Pool(pool)->shared_fd();
}

bufpool_pool* bufpool_join(int fd, char** err) noexcept {
  try {
    absl::StatusOr<std::unique_ptr<BufferPool>> pool = BufferPool::Join(fd);
    if (!pool.ok()) {
      StoreError(err, pool.status());
      return nullptr;
    }
    return reinterpret_cast<bufpool_pool*>(pool->release());
  } catch (const std::exception& e) {
    StoreError(err,
               absl::StrCat("RESOURCE_EXHAUSTED: bufpool_join: ", e.what()));
  } catch (...) {
    StoreError(err, "UNKNOWN: bufpool_join: unknown C++ exception");
  }
  return nullptr;
}

uint64_t bufpool_export(bufpool_pool* pool, void* buffer) noexcept {
  // Adopt() checks the pointer as a release does (aborts if it is not out).
  BufferPool* const p = Pool(pool);
  return p->Export(p->Adopt(static_cast<std::byte*>(buffer))).value;
}

void* bufpool_import(bufpool_pool* pool, uint64_t token, char** err) noexcept {
  try {
    absl::StatusOr<bufpool::Buffer> b =
        Pool(pool)->Import(bufpool::BufferToken{token});
    if (!b.ok()) {
      StoreError(err, b.status());
      return nullptr;
    }
    return b->Detach();  // out as a raw pointer, released as one
  } catch (const std::exception& e) {
    StoreError(err, absl::StrCat("UNKNOWN: bufpool_import: ", e.what()));
  } catch (...) {
    StoreError(err, "UNKNOWN: bufpool_import: unknown C++ exception");
  }
  return nullptr;
}

size_t bufpool_reclaim_dead(bufpool_pool* pool) noexcept {
  return Pool(pool)->ReclaimDead();
}

void bufpool_region(const bufpool_pool* pool, void** base,
                    size_t* length) noexcept {
  const absl::Span<std::byte> r = Pool(pool)->region();
  if (base != nullptr) *base = r.data();
  if (length != nullptr) *length = r.size();
}

size_t bufpool_trim(bufpool_pool* pool, size_t keep_free) noexcept {
  return Pool(pool)->Trim(keep_free);
}

size_t bufpool_trim_idle(bufpool_pool* pool) noexcept {
  return Pool(pool)->TrimIdle();
}

int bufpool_grow(bufpool_pool* pool, size_t buffers, char** err) noexcept {
  const absl::Status s = Pool(pool)->Grow(buffers);
  if (s.ok()) return 0;
  StoreError(err, s);
  return -1;
}

size_t bufpool_buffer_size(const bufpool_pool* pool) noexcept {
  return Pool(pool)->buffer_size();
}

size_t bufpool_capacity(const bufpool_pool* pool) noexcept {
  return Pool(pool)->capacity();
}

}  // extern "C"
