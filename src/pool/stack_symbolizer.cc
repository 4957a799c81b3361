// Frames for holder tracking's reports (stack_symbolizer.h): dladdr for the
// module and offset, absl::Symbolize for the function, and elfutils'
// libdwfl (loaded with dlopen) for files, lines and inlined calls.
#include "pool/stack_symbolizer.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/debugging/symbolize.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "os/syscalls.h"

#if BUFPOOL_HAVE_LIBDW
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#endif

namespace bufpool {

namespace {

// The path of the ELF file that maps `addr`, and the load bias to subtract
// from an address in it to get what addr2line takes (the address in the
// file: for a position-independent module, its offset from where it was
// loaded; for a fixed-address executable, the address itself).
bool ModuleOf(uintptr_t addr, std::string* path, uintptr_t* bias) {
  Dl_info info;
  link_map* map = nullptr;
  if (::dladdr1(reinterpret_cast<void*>(addr), &info,
                reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0 ||
      map == nullptr) {
    return false;
  }
  *bias = map->l_addr;
  if (map->l_name != nullptr && map->l_name[0] != '\0') {
    *path = map->l_name;
    return true;
  }
  // The main program's link map has no name: the kernel knows its path.
  char exe[PATH_MAX];
  const ssize_t n = os::Sys().readlink("/proc/self/exe", exe, sizeof(exe));
  *path = n > 0 ? std::string(exe, static_cast<size_t>(n))
                : std::string(info.dli_fname != nullptr ? info.dli_fname : "");
  return true;
}

// The library's own sources: the directory above src/pool/, as this file
// was named to the compiler, so that a frame in src/ (but not test/ or an
// example) is known as the library's.
std::string LibrarySourceRoot() {
  const std::string self = __FILE__;
  const std::string tail = "src/pool/stack_symbolizer.cc";
  return absl::EndsWith(self, tail) ? self.substr(0, self.size() - tail.size())
                                    : std::string();
}

bool IsLibraryFrame(const StackFrame& f) {
  static const std::string root = LibrarySourceRoot();
  // A relative file name (a compiler run from another directory, ccache's
  // base_dir) cannot be placed: judged by the name instead.
  if (!f.file.empty() && f.file.front() == '/') {
    // The installed headers' inline code, wherever the caller compiled it,
    // and the library's .cc files.
    return absl::StrContains(f.file, "/include/bufpool/") ||
           (!root.empty() && absl::StartsWith(f.file, root + "src/"));
  }
  // Without line information, by the name: the C++ API's classes and
  // functions, and the C API's functions. A caller's own code in namespace
  // bufpool's anonymous namespace (the project's tests) is not folded.
  return (absl::StartsWith(f.function, "bufpool::") &&
          !absl::StartsWith(f.function, "bufpool::(anonymous namespace)::") &&
          !absl::StartsWith(f.function, "bufpool::testing::")) ||
         absl::StartsWith(f.function, "bufpool_");
}

// `path` without "." and "dir/.." steps (a build directory's
// "/src/build/../lib/x.cc" is "/src/lib/x.cc"), lexically: no file is read.
[[maybe_unused]] std::string Normal(const char* path) {
  return std::filesystem::path(path).lexically_normal().string();
}

[[maybe_unused]] std::string Demangle(const char* name) {
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || out == nullptr) return name;
  std::string s(out);
  std::free(out);
  return s;
}

}  // namespace

std::string FormatFrame(const StackFrame& f) {
  std::string s = f.function;
  if (!f.file.empty()) absl::StrAppend(&s, " (", f.file, ":", f.line, ")");
  if (!f.module.empty()) {
    absl::StrAppend(&s, " ", f.module, "+0x", absl::Hex(f.offset));
  }
  return s;
}

#if BUFPOOL_HAVE_LIBDW

namespace {

// libdw's entry points, from libdw.so.1 loaded once for the process (and
// never unloaded: reports may be made at any time). Null members: not
// loaded; reports go without line information.
struct LibDw {
  decltype(&dwfl_begin) begin = nullptr;
  decltype(&dwfl_end) end = nullptr;
  decltype(&dwfl_linux_proc_report) proc_report = nullptr;
  decltype(&dwfl_linux_proc_find_elf) proc_find_elf = nullptr;
  decltype(&dwfl_standard_find_debuginfo) find_debuginfo = nullptr;
  decltype(&dwfl_report_begin) report_begin = nullptr;
  decltype(&dwfl_report_end) report_end = nullptr;
  decltype(&dwfl_addrmodule) addrmodule = nullptr;
  decltype(&dwfl_module_getsrc) getsrc = nullptr;
  decltype(&dwfl_module_addrname) addrname = nullptr;
  decltype(&dwfl_lineinfo) lineinfo = nullptr;
  decltype(&dwfl_module_addrdie) addrdie = nullptr;
  decltype(&dwarf_getscopes) getscopes = nullptr;
  decltype(&dwarf_getscopes_die) getscopes_die = nullptr;
  decltype(&dwarf_tag) tag = nullptr;
  decltype(&dwarf_attr_integrate) attr_integrate = nullptr;
  decltype(&dwarf_formstring) formstring = nullptr;
  decltype(&dwarf_formudata) formudata = nullptr;
  decltype(&dwarf_getsrcfiles) getsrcfiles = nullptr;
  decltype(&dwarf_filesrc) filesrc = nullptr;
  decltype(&dwarf_diename) diename = nullptr;
  bool loaded = false;

  static const LibDw& Get() {
    static const LibDw dw = Load();
    return dw;
  }

 private:
  static LibDw Load() {
    LibDw dw;
    void* h = ::dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return dw;
    bool ok = true;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
          ::dlsym(h, name));
      ok = ok && fn != nullptr;
    };
    get(dw.begin, "dwfl_begin");
    get(dw.end, "dwfl_end");
    get(dw.proc_report, "dwfl_linux_proc_report");
    get(dw.proc_find_elf, "dwfl_linux_proc_find_elf");
    get(dw.find_debuginfo, "dwfl_standard_find_debuginfo");
    get(dw.report_begin, "dwfl_report_begin");
    get(dw.report_end, "dwfl_report_end");
    get(dw.addrmodule, "dwfl_addrmodule");
    get(dw.getsrc, "dwfl_module_getsrc");
    get(dw.addrname, "dwfl_module_addrname");
    get(dw.lineinfo, "dwfl_lineinfo");
    get(dw.addrdie, "dwfl_module_addrdie");
    get(dw.getscopes, "dwarf_getscopes");
    get(dw.getscopes_die, "dwarf_getscopes_die");
    get(dw.tag, "dwarf_tag");
    get(dw.attr_integrate, "dwarf_attr_integrate");
    get(dw.formstring, "dwarf_formstring");
    get(dw.formudata, "dwarf_formudata");
    get(dw.getsrcfiles, "dwarf_getsrcfiles");
    get(dw.filesrc, "dwarf_filesrc");
    get(dw.diename, "dwarf_diename");
    dw.loaded = ok;
    return dw;
  }
};

}  // namespace

// A libdwfl session over this process's modules. One is kept for the
// process, so that what it has read of each module's debug information
// (most of a report's cost) serves every report; each report takes it
// alone and first reports the process's mappings again (/proc/self/maps:
// modules mapped as before keep what was read, new ones are added, gone
// ones dropped). A report made while another holds it (or in a fork()
// child whose other thread held it) makes a session of its own.
class StackSymbolizer::Dwarf {
 public:
  explicit Dwarf(const LibDw& dw) : dw_(dw) {
    // Never destroyed: a report may be made from another static's
    // destructor at exit.
    static Session* const shared = new Session(dw);
    if (shared->mu.try_lock()) {
      lock_ = std::unique_lock<std::mutex>(shared->mu, std::adopt_lock);
      session_ = shared;
    } else {
      own_ = std::make_unique<Session>(dw);
      session_ = own_.get();
    }
    if (session_->dwfl != nullptr) {
      dw.report_begin(session_->dwfl);
      if (dw.proc_report(session_->dwfl, ::getpid()) == 0 &&
          dw.report_end(session_->dwfl, nullptr, nullptr) == 0) {
        dwfl_ = session_->dwfl;
      }
    }
  }
  bool ok() const { return dwfl_ != nullptr; }

  // Fills the file and line of frames[0] (the code at `addr`) and adds a
  // frame for each call that was inlined at it, outermost last: the
  // function frames[0] names is the outermost, so its name moves there.
  void Resolve(uintptr_t addr, std::vector<StackFrame>* frames) {
    Dwfl_Module* mod = dw_.addrmodule(dwfl_, addr);
    if (mod == nullptr) return;
    StackFrame& innermost = frames->front();
    if (!innermost.named) {
      // A symbol absl::Symbolize did not find (a local one of a library
      // whose .symtab is in its debug file, say).
      if (const char* name = dw_.addrname(mod, addr)) {
        innermost.function = Demangle(name);
      }
    }
    if (Dwfl_Line* line = dw_.getsrc(mod, addr)) {
      int lineno = 0;
      if (const char* file =
              dw_.lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr)) {
        innermost.file = Normal(file);
        innermost.line = lineno;
      }
    }
    Dwarf_Addr bias = 0;
    Dwarf_Die* cu = dw_.addrdie(mod, addr, &bias);
    if (cu == nullptr) return;
    Dwarf_Files* files = nullptr;
    size_t nfiles = 0;
    if (dw_.getsrcfiles(cu, &files, &nfiles) != 0) files = nullptr;
    const StackFrame outer_template = innermost;
    const std::string outermost_name = innermost.function;
    // The scopes at the address, innermost first, up to the first function:
    // an inlined call's DIE names the inlined function and where it was
    // called from, which is the line of the next frame out. Past an
    // inlined call, dwarf_getscopes lists its abstract definition's scopes,
    // so the concrete ones around the call are asked of it by its DIE
    // (dwarf_getscopes_die), as eu-addr2line -i does.
    Dwarf_Die* scopes = nullptr;
    int n = dw_.getscopes(cu, addr - bias, &scopes);
    int i = 0;
    size_t at = 0;  // the frame the next inlined call names
    while (n > 0) {
      while (i < n && dw_.tag(&scopes[i]) != DW_TAG_inlined_subroutine &&
             dw_.tag(&scopes[i]) != DW_TAG_subprogram) {
        ++i;
      }
      if (i == n || dw_.tag(&scopes[i]) != DW_TAG_inlined_subroutine) break;
      Dwarf_Die die = scopes[i];
      (*frames)[at].function = Name(&die);
      StackFrame caller = outer_template;
      caller.file.clear();
      caller.line = 0;
      Dwarf_Attribute attr_mem;
      Dwarf_Word file_index = 0;
      Dwarf_Word line = 0;
      if (files != nullptr &&
          dw_.formudata(dw_.attr_integrate(&die, DW_AT_call_file, &attr_mem),
                        &file_index) == 0 &&
          file_index < nfiles) {
        if (const char* f = dw_.filesrc(files, file_index, nullptr, nullptr)) {
          caller.file = Normal(f);
        }
      }
      if (dw_.formudata(dw_.attr_integrate(&die, DW_AT_call_line, &attr_mem),
                        &line) == 0) {
        caller.line = static_cast<int>(line);
      }
      frames->push_back(std::move(caller));
      ++at;
      std::free(scopes);
      scopes = nullptr;
      n = dw_.getscopes_die(&die, &scopes);  // [0] is `die` itself
      i = 1;
    }
    frames->back().function = outermost_name;
    std::free(scopes);
  }

 private:
  // An inlined function's name: its linkage name demangled (qualified,
  // with its parameters), else its plain name.
  std::string Name(Dwarf_Die* die) {
    Dwarf_Attribute attr_mem;
    for (int at : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name}) {
      if (const char* s =
              dw_.formstring(dw_.attr_integrate(die, at, &attr_mem))) {
        return Demangle(s);
      }
    }
    // DW_AT_name, through the abstract origin.
    if (const char* s =
            dw_.formstring(dw_.attr_integrate(die, DW_AT_name, &attr_mem))) {
      return s;
    }
    return "(inlined)";
  }

  struct Session {
    explicit Session(const LibDw& dw) : dw(dw) {
      callbacks.find_elf = dw.proc_find_elf;
      callbacks.find_debuginfo = dw.find_debuginfo;
      callbacks.debuginfo_path = &debuginfo_path;
      dwfl = dw.begin(&callbacks);
    }
    ~Session() {
      if (dwfl != nullptr) dw.end(dwfl);
    }
    const LibDw& dw;
    std::mutex mu;
    char* debuginfo_path = nullptr;  // libdwfl's default search path
    Dwfl_Callbacks callbacks{};
    Dwfl* dwfl = nullptr;
  };

  const LibDw& dw_;
  std::unique_ptr<Session> own_;
  std::unique_lock<std::mutex> lock_;  // the shared session's
  Session* session_ = nullptr;
  Dwfl* dwfl_ = nullptr;  // null if the mappings could not be read
};

bool StackSymbolizer::HaveLineInformation() { return LibDw::Get().loaded; }

StackSymbolizer::StackSymbolizer() {
  if (LibDw::Get().loaded) {
    dwarf_ = std::make_unique<Dwarf>(LibDw::Get());
    if (!dwarf_->ok()) dwarf_.reset();
  }
}

#else  // !BUFPOOL_HAVE_LIBDW

class StackSymbolizer::Dwarf {
 public:
  void Resolve(uintptr_t, std::vector<StackFrame>*) {}
};

bool StackSymbolizer::HaveLineInformation() { return false; }

StackSymbolizer::StackSymbolizer() = default;

#endif  // BUFPOOL_HAVE_LIBDW

StackSymbolizer::~StackSymbolizer() = default;

const std::vector<StackFrame>& StackSymbolizer::Frames(uintptr_t pc) {
  auto [it, fresh] = cache_.try_emplace(pc);
  if (!fresh) return it->second;
  // pc - 1: a return address is the instruction after the call, which may
  // be the first byte of the next function or line (a noreturn callee);
  // the call itself is the byte before.
  const uintptr_t call = pc - 1;
  StackFrame f;
  char name[1024];
  f.named =
      absl::Symbolize(reinterpret_cast<const void*>(call), name, sizeof(name));
  f.function = f.named ? std::string(name) : absl::StrCat("0x", absl::Hex(pc));
  uintptr_t bias = 0;
  if (ModuleOf(call, &f.module, &bias)) f.offset = call - bias;
  std::vector<StackFrame>& frames = it->second;
  frames.push_back(std::move(f));
  if (dwarf_ != nullptr) dwarf_->Resolve(call, &frames);
  for (StackFrame& frame : frames) frame.library = IsLibraryFrame(frame);
  return frames;
}

}  // namespace bufpool
