// Turns the return addresses of a recorded stack into frames a person can
// act on, for holder tracking's reports (holders.cc).
//
// Each address becomes one frame, or several where the compiler inlined
// calls at it (innermost first, as a debugger lists them):
//
//   function (file:line) module+0xoffset
//
// `module+0xoffset` is always there (dladdr: the ELF file that holds the
// code and the address within it), so `addr2line -f -i -e module offset`
// answers without the process. `(file:line)` is there where the module has
// DWARF line tables: read with elfutils' libdwfl, loaded with dlopen the
// first time a report is made (libdw.so.1, Debian's libdw1), so a program
// that never makes a report never loads it and the library has no link
// dependency on it. Built without libdw's headers (libdw-dev), or with
// libdw.so.1 absent at run time, frames have the function and module+offset
// only. The function's name is from the symbol table (absl::Symbolize) for
// the outermost frame of an address and from the debug information for the
// inlined ones.
//
// Thread safety: one StackSymbolizer per thread (a report makes its own);
// any number may exist at once.
#ifndef BUFPOOL_SRC_POOL_STACK_SYMBOLIZER_H_
#define BUFPOOL_SRC_POOL_STACK_SYMBOLIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace bufpool {

struct StackFrame {
  std::string function;  // demangled; "0x..." when no symbol covers it
  bool named = false;    // `function` is a name
  std::string file;      // empty without line information
  int line = 0;
  std::string module;    // the ELF file's path
  uintptr_t offset = 0;  // the call's address in `module`, for addr2line
  // The library's own code (its sources or its installed headers, by the
  // file; without one, by the name): folded away from the top of a report.
  bool library = false;
};

// "function (file:line) module+0xoffset", the parts that are known.
std::string FormatFrame(const StackFrame& frame);

class StackSymbolizer {
 public:
  StackSymbolizer();
  ~StackSymbolizer();
  StackSymbolizer(const StackSymbolizer&) = delete;
  StackSymbolizer& operator=(const StackSymbolizer&) = delete;

  // The frames at return address `pc` (innermost first; never empty),
  // each address resolved once per symbolizer.
  const std::vector<StackFrame>& Frames(uintptr_t pc);

  // Whether file:line can be read here (libdw's headers at build time and
  // libdw.so.1 at run time).
  static bool HaveLineInformation();

 private:
  class Dwarf;
  std::unique_ptr<Dwarf> dwarf_;  // null without libdw
  std::unordered_map<uintptr_t, std::vector<StackFrame>> cache_;
};

}  // namespace bufpool

#endif  // BUFPOOL_SRC_POOL_STACK_SYMBOLIZER_H_
