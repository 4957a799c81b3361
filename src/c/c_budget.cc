// The C API's budgets (bufpool/c.h, "Budgets"): a thin shell over
// bufpool::BufferBudget.
//
// A bufpool_budget* is the BufferBudget* itself, cast. C has no chains, so
// a C caller charges its budget by taking whole buffers through it: the
// acquire is what a chain does when it starts a fresh buffer (TakeFresh,
// then Charge buffer_size), the release what it does when it drops one
// (Release buffer_size after the buffer went back to the pool, so that a
// short reserve refills from the buffer just freed, through the per-CPU
// cache). The watermark callbacks are C function pointers with their
// user_data, captured by value in the budget's std::function.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bufpool/budget.h"
#include "bufpool/buffer_pool.h"
#include "bufpool/c.h"
#include "c_internal.h"

namespace {

using bufpool::BudgetOptions;
using bufpool::BufferBudget;
using bufpool::BufferPool;
using bufpool::c_internal::CopyOut;
using bufpool::c_internal::StoreError;
using bufpool::internal::BudgetAccess;

constexpr bufpool_budget_options kBudgetDefaults = BUFPOOL_BUDGET_OPTIONS_INIT;
static_assert(kBudgetDefaults.struct_size == sizeof(bufpool_budget_options));
static_assert(kBudgetDefaults.reserved_bytes == 0);  // BudgetOptions' default

// Every field of the first version: a caller's struct must hold them all
// (later fields keep their defaults where a shorter struct ends before
// them, as bufpool_options' do).
constexpr size_t kBudgetOptionsV1Size = offsetof(bufpool_budget_options, group);

// Whether a caller's struct of `size` bytes holds `field` (at `offset`).
constexpr bool Holds(size_t size, size_t offset, size_t field) {
  return size >= offset + field;
}

BufferBudget* Budget(bufpool_budget* b) {
  return reinterpret_cast<BufferBudget*>(b);
}
const BufferBudget* Budget(const bufpool_budget* b) {
  return reinterpret_cast<const BufferBudget*>(b);
}

// The C options in C++ form, or the error naming the field.
absl::Status ToBudgetOptions(const bufpool_budget_options* in,
                             BudgetOptions* out) {
  if (in == nullptr) {
    return absl::InvalidArgumentError(
        "bufpool_budget_create: options is NULL (start from "
        "BUFPOOL_BUDGET_OPTIONS_INIT and set max_bytes)");
  }
  if (in->struct_size < kBudgetOptionsV1Size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bufpool_budget_create: bufpool_budget_options.struct_size is ",
        in->struct_size, ", less than the ", kBudgetOptionsV1Size,
        " bytes of the first version (start from "
        "BUFPOOL_BUDGET_OPTIONS_INIT)"));
  }
  if (in->struct_size > sizeof(bufpool_budget_options)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bufpool_budget_create: bufpool_budget_options.struct_size is ",
        in->struct_size, ", more than the ", sizeof(bufpool_budget_options),
        " bytes this library knows (built against a newer bufpool/c.h?)"));
  }
  out->name = in->name != nullptr ? in->name : "";
  out->max_bytes = in->max_bytes;
  out->high_watermark = in->high_watermark;
  out->low_watermark = in->low_watermark;
  out->reserved_bytes = in->reserved_bytes;
  if (Holds(in->struct_size, offsetof(bufpool_budget_options, group),
            sizeof(in->group)) &&
      in->group != nullptr) {
    out->group = in->group;
  }
  void* const user_data = in->user_data;
  if (bufpool_budget_callback f = in->on_high; f != nullptr) {
    out->on_high = [f, user_data] { f(user_data); };
  }
  if (bufpool_budget_callback f = in->on_low; f != nullptr) {
    out->on_low = [f, user_data] { f(user_data); };
  }
  return absl::OkStatus();
}

}  // namespace

extern "C" {

void bufpool_budget_options_init(bufpool_budget_options* options,
                                 size_t options_size) noexcept {
  bufpool_budget_options defaults = BUFPOOL_BUDGET_OPTIONS_INIT;
  defaults.struct_size = options_size;
  std::memcpy(options, &defaults, std::min(options_size, sizeof(defaults)));
}

bufpool_budget* bufpool_budget_create(bufpool_pool* pool,
                                      const bufpool_budget_options* options,
                                      char** err) noexcept {
  try {
    BudgetOptions cpp;
    if (absl::Status s = ToBudgetOptions(options, &cpp); !s.ok()) {
      StoreError(err, s);
      return nullptr;
    }
    absl::StatusOr<std::unique_ptr<BufferBudget>> budget =
        reinterpret_cast<BufferPool*>(pool)->CreateBudget(cpp);
    if (!budget.ok()) {
      StoreError(err, budget.status());
      return nullptr;
    }
    return reinterpret_cast<bufpool_budget*>(budget->release());
  } catch (const std::exception& e) {
    StoreError(err, absl::StrCat("RESOURCE_EXHAUSTED: bufpool_budget_create: ",
                                 e.what()));
  } catch (...) {
    StoreError(err, "UNKNOWN: bufpool_budget_create: unknown C++ exception");
  }
  return nullptr;
}

void bufpool_budget_destroy(bufpool_budget* budget) noexcept {
  delete Budget(budget);
}

void* bufpool_budget_acquire(bufpool_budget* budget, char** err) noexcept {
  BufferBudget& b = *Budget(budget);
  const size_t bs = b.pool().buffer_size();
  try {
    if (b.room_bytes() < bs) {
      StoreError(err, BudgetAccess::Refuse(b, "bufpool_budget_acquire", bs,
                                           "no buffer taken"));
      return nullptr;
    }
    bufpool::Buffer fresh = BudgetAccess::TakeFresh(b);
    if (!fresh) {
      StoreError(err, absl::ResourceExhaustedError(absl::StrCat(
                          "bufpool_budget_acquire: the pool has no free "
                          "buffer (budget \"",
                          b.name(), "\" pins ", b.pinned_bytes(), " of its ",
                          b.max_bytes(), " bytes)")));
      return nullptr;
    }
    BudgetAccess::Charge(b, bs);  // may run on_high
    return fresh.Detach();        // out as a raw pointer, released as one
  } catch (const std::exception& e) {
    // Only the error's own text can throw (bad_alloc); nothing was taken.
    StoreError(err, absl::StrCat("RESOURCE_EXHAUSTED: bufpool_budget_acquire: ",
                                 e.what()));
  }
  return nullptr;
}

void bufpool_budget_release(bufpool_budget* budget, void* buffer) noexcept {
  BufferBudget& b = *Budget(budget);
  const size_t bs = b.pool().buffer_size();
  if (b.pinned_bytes() < bs) {
    std::fprintf(stderr,
                 "bufpool: bufpool_budget_release: budget \"%s\" released "
                 "more than it acquired (it has %zu bytes charged; give "
                 "buffers from bufpool_try_acquire() back with "
                 "bufpool_release())\n",
                 b.name().c_str(), b.pinned_bytes());
    std::abort();
  }
  // Checks the pointer (aborts as bufpool_release() does), then the charge
  // comes off; a reserve that is now short refills from the pool.
  b.pool().ReleaseRaw(static_cast<std::byte*>(buffer));
  BudgetAccess::Release(b, bs);  // may run on_low
}

void bufpool_budget_get_stats_sized(const bufpool_budget* budget,
                                    bufpool_budget_stats* stats,
                                    size_t stats_size) noexcept {
  const BufferBudget& b = *Budget(budget);
  const bufpool::BudgetStats s = b.Stats();
  bufpool_budget_stats out;
  std::memset(&out, 0, sizeof(out));
  out.pinned_bytes = s.pinned_bytes;
  out.high_water_bytes = s.high_water_bytes;
  out.refusals = s.refusals;
  out.max_bytes = b.max_bytes();
  out.reserve_buffers = b.reserve_buffers();
  const size_t n = std::min(stats_size, sizeof(out));
  out.struct_size = n;
  std::memcpy(stats, &out, n);
}

size_t bufpool_budget_name(const bufpool_budget* budget, char* buf,
                           size_t size) noexcept {
  return CopyOut(Budget(budget)->name(), buf, size);
}

}  // extern "C"
