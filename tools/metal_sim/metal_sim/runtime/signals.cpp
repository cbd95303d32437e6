// Kernel crashes: a signal (fault, trap, abort) or an integer UB check
// ends the dispatch with a report naming the faulting instruction or the
// source line.
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>

#include "runtime.h"

namespace msim::detail {
namespace {

void on_signal(int signal, siginfo_t* info, void* context) {
  auto* uc = static_cast<ucontext_t*>(context);
  auto pc = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  const char* message = signal == SIGSEGV || signal == SIGBUS
                            ? "kernel crashed: invalid memory access (far out of bounds, or fiber stack overflow)"
                            : "kernel crashed";
  char line[512];
  int n = snprintf(line, sizeof line,
                   "{\"status\": \"error\", \"message\": \"%s (signal %d, address 0x%" PRIxPTR ")\", \"pc\": %" PRIuPTR "}\n",
                   message, signal, reinterpret_cast<uintptr_t>(info->si_addr), pc);
  (void)!write(1, line, n);
  _exit(3);
}

}  // namespace

void install_signal_handlers() {
  static char alternate_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alternate_stack;
  ss.ss_size = sizeof alternate_stack;
  sigaltstack(&ss, nullptr);
  struct sigaction action{};
  action.sa_sigaction = on_signal;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  for (int signal : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) sigaction(signal, &action, nullptr);
}

}  // namespace msim::detail

// -fsanitize=shift-exponent,integer-divide-by-zero handlers (clang's UBSan
// ABI): every check data record starts with the source location.
struct UbsanLocation {
  const char* file;
  uint32_t line;
  uint32_t column;
};

extern "C" void __ubsan_handle_shift_out_of_bounds_abort(const UbsanLocation* at, uintptr_t, uintptr_t) {
  msim::fail("integer UB: shift amount negative or >= the operand's bit width", {at->file, at->line});
}

extern "C" void __ubsan_handle_divrem_overflow_abort(const UbsanLocation* at, uintptr_t, uintptr_t) {
  msim::fail("integer UB: division by zero (or INT_MIN / -1)", {at->file, at->line});
}
