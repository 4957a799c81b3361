// Destinations written as cp writes them: resolving the path, the refusals,
// opening the existing file in place or a temporary file beside it, and the
// size, owner, mode and times at the end.
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "copy/copy_internal.h"
#include "os/error.h"
#include "os/file.h"
#include "os/syscalls.h"

namespace bufpool::copy_internal {
namespace {

using Replace = CopyOptions::Replace;

// The mode a new file is created with (the umask then applies): the
// source's permission bits, its special bits only when they are preserved.
mode_t NewFileMode(const struct stat& src_st, const CopyOptions& options) {
  return src_st.st_mode & (options.preserve_mode ? 07777 : 0777);
}

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

absl::Status SameFileError(const std::string& dst) {
  return absl::InvalidArgumentError(
      absl::StrCat("refusing to copy a file onto itself: ", dst,
                   ": source and destination are the same file"));
}

// Refusals that depend on what is at the destination (followed).
absl::Status CheckExisting(const struct stat& src_st,
                           const CopyOptions& options, const Target& t) {
  const struct stat& st = t.st;
  if (S_ISDIR(st.st_mode)) {
    return IoError("destination is a directory", t.path, EISDIR);
  }
  // As cp -n: anything there, the source itself included, is left alone.
  if (options.no_clobber) {
    return absl::AlreadyExistsError(
        absl::StrCat("not overwriting existing destination: ", t.path));
  }
  if (SameFile(st, src_st)) return SameFileError(t.path);
  if (S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "destination is a socket: ", t.path, ": a socket cannot be written"));
  }
  if (options.replace == Replace::kAtomic && S_ISREG(st.st_mode) &&
      st.st_nlink > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to replace ", t.path, " atomically: it has ", st.st_nlink,
        " hard links, and a new file would leave the other names with the "
        "old bytes; copy in place instead"));
  }
  return absl::OkStatus();
}

// Fills t.path, t.exists and t.st and applies the refusals that need no
// descriptor.
absl::Status Resolve(const std::string& src, const struct stat& src_st,
                     absl::string_view dst_view, const CopyOptions& options,
                     Target& t) {
  const std::string dst = CopyDestination(src, dst_view);
  struct stat st;
  t.path = dst;
  t.write_path = dst;
  struct stat lst;
  if (os::Sys().lstat(dst.c_str(), &lst) != 0) {
    if (errno != ENOENT) return IoError("stat destination", dst, errno);
    t.replace = options.replace;  // a new file
    return absl::OkStatus();
  }
  if (S_ISLNK(lst.st_mode)) {
    if (os::Sys().stat(dst.c_str(), &st) != 0) {
      if (errno == ENOENT) {
        return absl::FailedPreconditionError(
            absl::StrCat("not writing through dangling symlink: ", dst));
      }
      return IoError("stat destination", dst, errno);
    }
  } else {
    st = lst;
  }
  t.exists = true;
  t.st = st;
  t.regular = S_ISREG(st.st_mode);
  if (absl::Status s = CheckExisting(src_st, options, t); !s.ok()) return s;
  // A device or FIFO is written, never replaced.
  t.replace = t.regular ? options.replace : Replace::kInPlace;
  if (t.replace == Replace::kAtomic && S_ISLNK(lst.st_mode)) {
    // The link stays; the file it names is replaced.
    char* real = os::Sys().realpath(dst.c_str(), nullptr);
    if (real == nullptr) return IoError("resolve symbolic link", dst, errno);
    t.write_path = real;
    free(real);
  }
  return absl::OkStatus();
}

absl::Status OpenInPlace(const struct stat& src_st, const CopyOptions& options,
                         Target& t) {
  const char* path = t.write_path.c_str();
  if (!t.exists) {
    t.fd = os::Sys().open(path, O_WRONLY | O_CREAT | O_EXCL,
                          NewFileMode(src_st, options));
    if (t.fd < 0) {
      if (errno == EEXIST && options.no_clobber) {
        return absl::AlreadyExistsError(
            absl::StrCat("not overwriting existing destination: ", t.path));
      }
      return IoError("create", t.path, errno);
    }
    t.created = true;
    return absl::OkStatus();
  }
  t.fd = os::Sys().open(path, O_WRONLY, 0);
  if (t.fd < 0) return IoError("open destination", t.path, errno);
  // What was opened is checked again: the name may have changed since.
  struct stat now;
  if (os::Sys().fstat(t.fd, &now) != 0) {
    return IoError("stat destination", t.path, errno);
  }
  if (SameFile(now, src_st)) return SameFileError(t.path);
  t.regular = S_ISREG(now.st_mode);
  t.st = now;
  return absl::OkStatus();
}

// Creates ".<name>.bufpool-copy.XXXXXX" beside t.write_path: mode 0600 when
// it replaces a file (it gets that file's mode before the rename), the new
// file's mode otherwise.
absl::Status OpenTemp(const struct stat& src_st, const CopyOptions& options,
                      Target& t) {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  // Relaxed: the counter only makes seeds differ; it orders nothing.
  std::mt19937_64 rng((uint64_t{rd()} << 32) ^ rd() ^
                      counter.fetch_add(1, std::memory_order_relaxed));
  static constexpr char kChars[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  const std::string dir = DirName(t.write_path);
  const std::string name = BaseName(t.write_path);
  const mode_t mode = t.exists ? 0600 : NewFileMode(src_st, options);
  int err = EEXIST;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string suffix(6, 'x');
    for (char& c : suffix) c = kChars[rng() % (sizeof(kChars) - 1)];
    std::string path = absl::StrCat(dir, "/.", name, ".bufpool-copy.", suffix);
    const int fd =
        os::Sys().open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, mode);
    if (fd >= 0) {
      t.fd = fd;
      t.temp = std::move(path);
      return absl::OkStatus();
    }
    err = errno;
    if (err != EEXIST && err != EINTR) break;
  }
  absl::Status s = IoError("create temporary file for", t.path, err);
  if (t.exists && (err == EACCES || err == EPERM)) {
    return absl::Status(
        s.code(), absl::StrCat(s.message(),
                               " (the directory takes no new names; an "
                               "in-place copy writes into the existing file)"));
  }
  return s;
}

// kAtomic over an existing file: the replacement gets its owner, group and
// mode before it takes the name.
absl::Status TakeOverAttributes(Target& t) {
  struct stat now;
  if (os::Sys().fstat(t.fd, &now) != 0) {
    return IoError("stat temporary file for", t.path, errno);
  }
  if ((now.st_uid != t.st.st_uid || now.st_gid != t.st.st_gid) &&
      os::Sys().fchown(t.fd, t.st.st_uid, t.st.st_gid) != 0) {
    const absl::Status s =
        IoError("give the new file the owner and group of", t.path, errno);
    return absl::Status(
        s.code(), absl::StrCat(s.message(), " (an in-place copy keeps them)"));
  }
  if (os::Sys().fchmod(t.fd, t.st.st_mode & 07777) != 0) {
    return IoError("set mode of", t.path, errno);
  }
  return absl::OkStatus();
}

absl::Status FsyncFd(int fd, const std::string& path, const char* what) {
  // Never retried: after a failed fsync the page cache may have dropped the
  // dirty pages, so a second fsync could "succeed" without the data.
  if (os::Sys().fsync(fd) != 0) return IoError(what, path, errno);
  return absl::OkStatus();
}

absl::Status FsyncDirectory(const std::string& dir) {
  const int dfd = os::Sys().open(dir.c_str(), O_RDONLY | O_DIRECTORY, 0);
  if (dfd < 0) return IoError("open directory", dir, errno);
  absl::Status s = FsyncFd(dfd, dir, "fsync directory");
  os::Sys().close(dfd);
  return s;
}

// Renames the temporary file to t.write_path; with no_clobber never over an
// existing name (RENAME_NOREPLACE, or link() where the file system lacks it).
absl::Status RenameIntoPlace(const CopyOptions& options, Target& t) {
  const char* from = t.temp.c_str();
  const char* to = t.write_path.c_str();
  int err = 0;
  if (!options.no_clobber) {
    if (os::Sys().rename(from, to) != 0) err = errno;
  } else if (os::Sys().renameat2(AT_FDCWD, from, AT_FDCWD, to,
                                 RENAME_NOREPLACE) != 0) {
    err = errno;
    if (err == EINVAL || err == ENOSYS) {
      err = os::Sys().link(from, to) == 0 ? 0 : errno;
      // On success both names exist; Abandon() removes the temporary one.
      if (err == 0) return absl::OkStatus();
    }
  }
  if (err == EEXIST && options.no_clobber) {
    return absl::AlreadyExistsError(
        absl::StrCat("not overwriting existing destination: ", t.path));
  }
  if (err != 0) return IoError("rename into place", t.path, err);
  t.temp.clear();
  return absl::OkStatus();
}

}  // namespace

std::string BaseName(absl::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  const size_t slash = path.rfind('/');
  return std::string(slash == absl::string_view::npos ? path
                                                      : path.substr(slash + 1));
}

std::string DirName(absl::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

void Target::Abandon() {
  if (fd >= 0) os::Sys().close(std::exchange(fd, -1));
  if (!temp.empty()) os::Sys().unlink(std::exchange(temp, "").c_str());
  if (created && !done) os::Sys().unlink(write_path.c_str());
  created = created && done;
}

absl::Status OpenTarget(const std::string& src, const struct stat& src_st,
                        absl::string_view dst, const CopyOptions& options,
                        Target& t) {
  if (absl::Status s = Resolve(src, src_st, dst, options, t); !s.ok()) {
    return s;
  }
  return t.replace == Replace::kAtomic ? OpenTemp(src_st, options, t)
                                       : OpenInPlace(src_st, options, t);
}

absl::Status TruncateForWriting(Target& t) {
  if (t.replace == Replace::kInPlace && t.exists && t.regular &&
      os::Sys().ftruncate(t.fd, 0) != 0) {
    return IoError("truncate", t.path, errno);
  }
  return absl::OkStatus();
}

absl::Status PreserveAttributes(int fd, const std::string& path,
                                const struct stat& src_st,
                                const CopyOptions& options) {
  const os::SyscallTable& sys = os::Sys();
  mode_t mode = src_st.st_mode & 07777;
  if (options.preserve_ownership) {
    auto chown = [&](uid_t u, gid_t g) {
      return fd >= 0 ? sys.fchown(fd, u, g) : sys.lchown(path.c_str(), u, g);
    };
    if (chown(src_st.st_uid, src_st.st_gid) != 0) {
      if (errno != EPERM && errno != EINVAL) {
        return IoError("set owner of", path, errno);
      }
      mode &= ~S_ISUID;  // not set-user-ID for someone else
      if (chown(static_cast<uid_t>(-1), src_st.st_gid) != 0) {
        if (errno != EPERM && errno != EINVAL) {
          return IoError("set group of", path, errno);
        }
        mode &= ~S_ISGID;
      }
    }
  }
  if (options.preserve_mode &&
      (fd >= 0 ? sys.fchmod(fd, mode) : sys.chmod(path.c_str(), mode)) != 0) {
    return IoError("set mode of", path, errno);
  }
  if (options.preserve_timestamps) {
    const struct timespec times[2] = {src_st.st_atim, src_st.st_mtim};
    if ((fd >= 0 ? sys.futimens(fd, times)
                 : sys.utimensat(AT_FDCWD, path.c_str(), times,
                                 AT_SYMLINK_NOFOLLOW)) != 0) {
      return IoError("set times of", path, errno);
    }
  }
  return absl::OkStatus();
}

absl::Status FinishTarget(const struct stat& src_st, uint64_t size,
                          const CopyOptions& options, Target& t) {
  if (t.regular && !t.sized &&
      os::Sys().ftruncate(t.fd, static_cast<off_t>(size)) != 0) {
    return IoError("truncate", t.path, errno);
  }
  const bool atomic = t.replace == Replace::kAtomic;
  if (atomic && t.exists) {
    if (absl::Status s = TakeOverAttributes(t); !s.ok()) return s;
  }
  if (absl::Status s = PreserveAttributes(t.fd, t.path, src_st, options);
      !s.ok()) {
    return s;
  }
  if (options.fsync) {
    if (absl::Status s = FsyncFd(t.fd, t.path, "fsync"); !s.ok()) return s;
  }
  if (os::Sys().close(std::exchange(t.fd, -1)) != 0 && errno != EINTR) {
    return IoError("close", t.path, errno);
  }
  if (atomic) {
    if (absl::Status s = RenameIntoPlace(options, t); !s.ok()) return s;
  }
  t.done = true;
  if (options.fsync && (atomic || t.created)) {
    return FsyncDirectory(DirName(t.write_path));
  }
  return absl::OkStatus();
}

}  // namespace bufpool::copy_internal
