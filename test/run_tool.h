// Runs an installed tool to completion for the CLI tests: no shell, stdin
// from /dev/null, stdout and stderr captured through files in a scratch
// directory.
#ifndef BUFPOOL_TEST_RUN_TOOL_H_
#define BUFPOOL_TEST_RUN_TOOL_H_

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace bufpool_test {

struct Result {
  int status;  // exit status; -1 when killed by a signal, -2 not started
  std::string out, err;
};

inline std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// argv for posix_spawn: pointers into `all`, then nullptr.
inline std::vector<char*> Argv(std::vector<std::string>& all) {
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  return argv;
}

inline Result RunTool(const std::string& bin,
                      const std::vector<std::string>& args,
                      const std::string& scratch_dir) {
  std::vector<std::string> all = {bin};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv = Argv(all);
  const std::string out = scratch_dir + "/.stdout";
  const std::string err = scratch_dir + "/.stderr";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = -1;
  const int rc =
      posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return {-2, "", std::strerror(rc)};
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, Slurp(out), Slurp(err)};
}

}  // namespace bufpool_test

#endif  // BUFPOOL_TEST_RUN_TOOL_H_
