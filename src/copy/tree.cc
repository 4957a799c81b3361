// CopyTree: a depth-first walk that recreates directories, links and nodes
// and hands regular files to worker threads running CopyFile, several files
// in flight at once; each entry's failure is recorded and the walk goes on.
//
// Threads: the walking thread (the caller) and kFileWorkers workers. What
// they share (the queue of files, TreeStats) is guarded by one mutex each;
// nothing is read without it, so the mutexes give all the ordering needed.
// Directory modes and times are set by the walking thread after every
// worker has finished, deepest first: creating entries changes a
// directory's times, and a read-only directory must stay writable until its
// files exist.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bufpool/file_copy.h"
#include "copy/copy_internal.h"
#include "os/error.h"
#include "os/file.h"
#include "os/syscalls.h"

namespace bufpool {
namespace copy_internal {
namespace {

// Files copied at once. Each CopyFile mostly waits in the kernel (opening,
// creating, reading a cold source), so a few in flight overlap those waits
// even on one CPU.
constexpr size_t kFileWorkers = 4;
// Files the walk may queue ahead of the workers (bounds the memory).
constexpr size_t kMaxQueuedFiles = 4096;

class TreeCopier {
 public:
  TreeCopier(const CopyOptions& options, TreeStats& stats)
      : options_(options), stats_(stats) {
    link_options_ = options;
    link_options_.preserve_mode = false;  // chmod would follow the link
  }
  ~TreeCopier() { FinishFiles(); }

  // Starts the workers; with none (thread creation refused) files are
  // copied by the walking thread.
  void StartWorkers();
  // Copies the directory `src` (whose lstat is `st`) to `dst`; its mode and
  // times wait for FinishDirectories.
  void Directory(const std::string& src, const struct stat& st,
                 const std::string& dst);
  // Waits for every queued file, then stops the workers.
  void FinishFiles();
  // Sets the modes and times of the directories made, deepest first.
  void FinishDirectories();

 private:
  struct PendingDirectory {
    std::string dst;
    struct stat st;
    bool created;
  };
  void Entry(const std::string& src, const std::string& dst);
  void File(const std::string& src, const std::string& dst);
  void Worker();
  void Symlink(const std::string& src, const struct stat& st,
               const std::string& dst);
  void Node(const struct stat& st, const std::string& dst);
  // The names in `dir`, "." and ".." left out; false (reported) on error.
  bool List(const std::string& dir, std::vector<std::string>& names);
  void Report(absl::string_view what, const std::string& path, int err) {
    Report(IoError(what, path, err));
  }
  // An existing destination under no_clobber: skipped silently, as cp -n
  // skips it.
  bool Clobbered(const absl::Status& s) const {
    return options_.no_clobber && absl::IsAlreadyExists(s);
  }
  void Report(const absl::Status& s) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.errors.push_back(std::string(s.message()));
    if (first_error_.ok()) first_error_ = s;
  }

 public:
  // The first error reported (OK if none). Call after FinishFiles.
  absl::Status first_error() const { return first_error_; }

 private:
  void Count(uint64_t TreeStats::*counter, uint64_t bytes = 0) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++(stats_.*counter);
    stats_.bytes_copied += bytes;
  }

  const CopyOptions& options_;
  CopyOptions link_options_;
  std::mutex stats_mu_;
  TreeStats& stats_;          // guarded by stats_mu_ while workers run
  absl::Status first_error_;  // guarded by stats_mu_
  std::vector<PendingDirectory> directories_;  // walking thread only

  std::mutex queue_mu_;
  std::condition_variable queue_ready_;  // a file queued, or closed_
  std::condition_variable queue_room_;   // a file taken
  std::deque<std::pair<std::string, std::string>> queue_;  // (src, dst)
  bool closed_ = false;
  std::vector<std::thread> workers_;
};

void TreeCopier::StartWorkers() {
  for (size_t i = 0; i < kFileWorkers; ++i) {
    try {
      workers_.emplace_back([this] { Worker(); });
    } catch (const std::system_error&) {
      break;  // fewer workers (or none: the walk copies files itself)
    }
  }
}

void TreeCopier::Worker() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  for (;;) {
    queue_ready_.wait(lock, [this] { return closed_ || !queue_.empty(); });
    if (queue_.empty()) return;  // closed and drained
    std::pair<std::string, std::string> job = std::move(queue_.front());
    queue_.pop_front();
    queue_room_.notify_one();
    lock.unlock();
    absl::StatusOr<CopyStats> r = CopyFile(job.first, job.second, options_);
    if (r.ok()) {
      Count(&TreeStats::files, r->bytes_copied);
    } else if (!Clobbered(r.status())) {
      Report(r.status());
    }
    lock.lock();
  }
}

void TreeCopier::File(const std::string& src, const std::string& dst) {
  if (workers_.empty()) {
    absl::StatusOr<CopyStats> r = CopyFile(src, dst, options_);
    if (!r.ok()) return Clobbered(r.status()) ? void() : Report(r.status());
    return Count(&TreeStats::files, r->bytes_copied);
  }
  std::unique_lock<std::mutex> lock(queue_mu_);
  queue_room_.wait(lock, [this] { return queue_.size() < kMaxQueuedFiles; });
  queue_.emplace_back(src, dst);
  queue_ready_.notify_one();
}

void TreeCopier::FinishFiles() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    closed_ = true;
  }
  queue_ready_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

void TreeCopier::FinishDirectories() {
  // Post-order: every directory comes after the ones inside it.
  for (const PendingDirectory& d : directories_) {
    const mode_t mode = d.st.st_mode & 0777;
    if (d.created && (mode & S_IRWXU) != S_IRWXU) {
      struct stat made;
      if (os::Sys().stat(d.dst.c_str(), &made) == 0 &&
          os::Sys().chmod(d.dst.c_str(),
                          made.st_mode & 07777 & ~(S_IRWXU & ~mode)) != 0) {
        Report("set mode of", d.dst, errno);
      }
    }
    if (absl::Status s = PreserveAttributes(-1, d.dst, d.st, options_);
        !s.ok()) {
      Report(s);
    }
  }
  directories_.clear();
}

bool TreeCopier::List(const std::string& dir, std::vector<std::string>& names) {
  DIR* d = os::Sys().opendir(dir.c_str());
  if (d == nullptr) {
    Report("open directory", dir, errno);
    return false;
  }
  errno = 0;
  while (dirent* e = os::Sys().readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
    errno = 0;
  }
  const int err = errno;
  os::Sys().closedir(d);
  if (err != 0) {
    Report("read directory", dir, err);
    return false;
  }
  return true;
}

void TreeCopier::Directory(const std::string& src, const struct stat& st,
                           const std::string& dst) {
  // Created writable and searchable by its owner so the entries can be
  // made; the bits the source lacks are taken away afterwards.
  const mode_t mode = st.st_mode & 0777;
  bool created = true;
  if (os::Sys().mkdir(dst.c_str(), mode | S_IRWXU) != 0) {
    struct stat existing;
    if (errno != EEXIST || os::Sys().stat(dst.c_str(), &existing) != 0 ||
        !S_ISDIR(existing.st_mode)) {
      Report("create directory", dst, errno == 0 ? EEXIST : errno);
      return;
    }
    created = false;  // merged into, as cp does; its mode stays
  }
  Count(&TreeStats::directories);
  std::vector<std::string> names;
  if (List(src, names)) {
    for (const std::string& name : names) {
      Entry(absl::StrCat(src, "/", name), absl::StrCat(dst, "/", name));
    }
  }
  directories_.push_back({dst, st, created});
}

void TreeCopier::Entry(const std::string& src, const std::string& dst) {
  struct stat st;
  if (os::Sys().lstat(src.c_str(), &st) != 0) {
    Report("stat", src, errno);
    return;
  }
  if (S_ISDIR(st.st_mode)) return Directory(src, st, dst);
  if (S_ISLNK(st.st_mode)) return Symlink(src, st, dst);
  if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
    return Node(st, dst);
  }
  if (!S_ISREG(st.st_mode)) {
    return Report(absl::FailedPreconditionError(absl::StrCat(
        "skipped: ", src, ": a socket or other special file is not copied")));
  }
  // stat, not lstat: a symbolic link to a directory is refused too, as cp
  // refuses it, rather than followed to write the file inside its target.
  struct stat at;
  if (os::Sys().stat(dst.c_str(), &at) == 0 && S_ISDIR(at.st_mode)) {
    Report("cannot overwrite directory with non-directory", dst, EISDIR);
    return;
  }
  File(src, dst);
}

void TreeCopier::Symlink(const std::string& src, const struct stat& st,
                         const std::string& dst) {
  std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
  const ssize_t n =
      os::Sys().readlink(src.c_str(), target.data(), target.size());
  if (n < 0) return Report("read symbolic link", src, errno);
  target.resize(static_cast<size_t>(n));
  if (os::Sys().symlink(target.c_str(), dst.c_str()) != 0) {
    if (errno == EEXIST && options_.no_clobber) return;  // cp -n: skipped
    return Report("create symbolic link", dst, errno);
  }
  Count(&TreeStats::symlinks);
  if (absl::Status s = PreserveAttributes(-1, dst, st, link_options_);
      !s.ok()) {
    Report(s);
  }
}

void TreeCopier::Node(const struct stat& st, const std::string& dst) {
  const mode_t type = st.st_mode & S_IFMT;
  if (os::Sys().mknod(dst.c_str(), type | (st.st_mode & 0777), st.st_rdev) !=
      0) {
    if (errno == EEXIST && options_.no_clobber) return;  // cp -n: skipped
    return Report(S_ISFIFO(st.st_mode) ? "create FIFO" : "create device node",
                  dst, errno);
  }
  Count(&TreeStats::nodes);
  if (absl::Status s = PreserveAttributes(-1, dst, st, options_); !s.ok()) {
    Report(s);
  }
}

// Refuses a destination inside the source (it would copy itself forever).
absl::Status CheckNotInside(const std::string& src, const std::string& dst) {
  char* s = os::Sys().realpath(src.c_str(), nullptr);
  if (s == nullptr) return IoError("resolve", src, errno);
  std::string real_src = s;
  free(s);
  char* d = os::Sys().realpath(DirName(dst).c_str(), nullptr);
  if (d == nullptr) return absl::OkStatus();  // mkdir will say why
  std::string real_parent = d;
  free(d);
  const std::string real_dst =
      absl::StrCat(real_parent, real_parent == "/" ? "" : "/", BaseName(dst));
  if (real_dst == real_src || real_dst.starts_with(real_src + "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot copy a directory, ", src, ", into itself, ", dst));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace copy_internal

absl::StatusOr<TreeStats> CopyTree(absl::string_view src_view,
                                   absl::string_view dst_view,
                                   const CopyOptions& options) {
  using namespace copy_internal;  // NOLINT: this room's own internals
  const absl::Time start = absl::Now();
  std::string src(src_view);
  while (src.size() > 1 && src.back() == '/') src.pop_back();
  std::string dst(dst_view);
  struct stat st;
  if (os::Sys().stat(src.c_str(), &st) != 0) {
    return IoError("stat source", src, errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    return IoError("source is not a directory", src, ENOTDIR);
  }
  dst = CopyDestination(src, dst);
  while (dst.size() > 1 && dst.back() == '/') dst.pop_back();
  if (absl::Status s = CheckNotInside(src, dst); !s.ok()) return s;
  // One pool for every file, rather than one created and destroyed per
  // file: for a tree of small files that setup would cost more than the
  // copies.
  CopyOptions file_options = options;
  file_options.progress = nullptr;  // CopyFile would call it from workers
  std::unique_ptr<BufferPool> pool;
  if (options.pool == nullptr) {
    PoolOptions po;
    po.buffer_size = options.buffer_size;
    po.buffer_count = DefaultBufferCount(options) * kFileWorkers;
    po.cache_size = 0;
    absl::StatusOr<std::unique_ptr<BufferPool>> p = BufferPool::Create(po);
    if (!p.ok()) return p.status();
    pool = *std::move(p);
    file_options.pool = pool.get();
  }
  TreeStats stats;
  stats.destination = dst;
  {
    TreeCopier copier(file_options, stats);
    copier.StartWorkers();
    copier.Directory(src, st, dst);
    copier.FinishFiles();
    copier.FinishDirectories();
    // The root could not be made: nothing was copied.
    if (stats.directories == 0 && !stats.errors.empty()) {
      return copier.first_error();
    }
  }
  stats.elapsed = absl::Now() - start;
  return stats;
}

}  // namespace bufpool
