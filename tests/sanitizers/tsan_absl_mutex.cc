// Preloaded (LD_PRELOAD) into every process of the TSan run of scripts/test-sanitizers.sh.
//
// Why: Debian's abseil is compiled without -fsanitize=thread, so the TSan annotations inside
// absl::Mutex are compiled out and its lock word is changed by uninstrumented atomics. TSan then
// sees no happens-before edge between one thread's Unlock() and the next thread's Lock(), and
// reports every field an absl::Mutex guards as a data race. Suppressing those would hide real
// races in our code, so instead this library interposes the Mutex, CondVar and Notification
// entry points (the executable's and libabsl's calls bind to the first definition in load
// order, which is this preloaded one), calls abseil's own implementation found with
// dlsym(RTLD_NEXT), and tells TSan what happened with its public mutex annotations.
//
// Conditions (Await, LockWhen, CondVar waits) are evaluated by abseil on whichever thread holds
// the lock at the time, so the real call runs inside an annotation bracket in which TSan
// ignores accesses; the waiter then takes the lock afresh as far as TSan is concerned.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

// abseil's definition of a symbol this library also defines.
template <typename Fn>
Fn Next(Fn, const char* mangled) {
  void* p = dlsym(RTLD_NEXT, mangled);
  if (p == nullptr) {
    std::fprintf(stderr, "tsan_absl_mutex: %s not found: %s\n", mangled, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

// Member functions called through plain function pointers taking `this` first (the Itanium
// ABI's convention for non-virtual members). The mangled names are those of the
// abseil release Debian bookworm ships (inline namespace debian3).
#define STRATA_NEXT(var, type, mangled)    \
  static const auto var = Next(static_cast<type>(nullptr), mangled)

using MuFn = void (*)(absl::Mutex*);
using MuTryFn = bool (*)(absl::Mutex*);
using MuCondFn = void (*)(absl::Mutex*, const absl::Condition&);
using MuCondDurFn = bool (*)(absl::Mutex*, const absl::Condition&, absl::Duration);
using MuCondTimeFn = bool (*)(absl::Mutex*, const absl::Condition&, absl::Time);
using CvFn = void (*)(absl::CondVar*, absl::Mutex*);
using CvDurFn = bool (*)(absl::CondVar*, absl::Mutex*, absl::Duration);
using CvTimeFn = bool (*)(absl::CondVar*, absl::Mutex*, absl::Time);
using NoteFn = void (*)(absl::Notification*);
using NoteWaitFn = void (*)(const absl::Notification*);
using NoteDurFn = bool (*)(const absl::Notification*, absl::Duration);
using NoteTimeFn = bool (*)(const absl::Notification*, absl::Time);

constexpr unsigned kRead = __tsan_mutex_read_lock;

// abseil calls some of these entry points from others (CondVar::WaitWithTimeout calls
// WaitWithDeadline, the timed Await and LockWhen forms call their deadline forms, a CondVar wait
// may take the mutex again through Lock). Those inner calls bind to this library too, and
// annotating them again would tell TSan about a second unlock of a mutex it already saw
// released. Only the outermost call on a thread is annotated; inner ones go straight to abseil.
thread_local int depth = 0;

struct Nested {
  Nested() { ++depth; }
  ~Nested() { --depth; }
  Nested(const Nested&) = delete;
  Nested& operator=(const Nested&) = delete;
};

// A plain lock: TSan sees it taken (or not, for a failed try) after abseil returns.
template <typename F>
auto Locking(absl::Mutex* mu, unsigned mode, F&& real) {
  if (depth > 0) return real();
  __tsan_mutex_pre_lock(mu, mode);
  bool ok;
  {
    Nested n;
    ok = real();
  }
  __tsan_mutex_post_lock(mu, mode | (ok ? 0 : __tsan_mutex_try_lock_failed), 0);
  return ok;
}

// A plain unlock (conditions of waiters run inside abseil's call: ignored).
template <typename F>
void Unlocking(absl::Mutex* mu, unsigned mode, F&& real) {
  if (depth > 0) return real();
  __tsan_mutex_pre_unlock(mu, mode);
  {
    Nested n;
    real();
  }
  __tsan_mutex_post_unlock(mu, mode);
}

// A wait that releases `mu` inside abseil and holds it again on return: TSan sees an unlock,
// no accesses during the call (conditions run there, possibly on other threads), then a lock.
template <typename F>
auto WaitReleasing(absl::Mutex* mu, unsigned mode, F&& real) {
  if (depth > 0) return real();
  __tsan_mutex_pre_unlock(mu, mode);
  decltype(real()) r;
  {
    Nested n;
    r = real();
  }
  __tsan_mutex_post_unlock(mu, mode);
  __tsan_mutex_pre_lock(mu, mode);
  __tsan_mutex_post_lock(mu, mode, 0);
  return r;
}

// A lock that waits for a condition: accesses inside (the condition) ignored, then the lock.
template <typename F>
auto LockWaiting(absl::Mutex* mu, unsigned mode, F&& real) {
  if (depth > 0) return real();
  __tsan_mutex_pre_lock(mu, mode);
  decltype(real()) r;
  {
    Nested n;
    r = real();
  }
  __tsan_mutex_post_lock(mu, mode | (r ? 0 : __tsan_mutex_try_lock_failed), 0);
  return r;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  STRATA_NEXT(real, MuFn, "_ZN4absl7debian35Mutex4LockEv");
  Locking(this, 0, [&] { real(this); return true; });
}

void Mutex::Unlock() {
  STRATA_NEXT(real, MuFn, "_ZN4absl7debian35Mutex6UnlockEv");
  Unlocking(this, 0, [&] { real(this); });
}

bool Mutex::TryLock() {
  STRATA_NEXT(real, MuTryFn, "_ZN4absl7debian35Mutex7TryLockEv");
  return Locking(this, __tsan_mutex_try_lock, [&] { return real(this); });
}

void Mutex::ReaderLock() {
  STRATA_NEXT(real, MuFn, "_ZN4absl7debian35Mutex10ReaderLockEv");
  Locking(this, kRead, [&] { real(this); return true; });
}

void Mutex::ReaderUnlock() {
  STRATA_NEXT(real, MuFn, "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Unlocking(this, kRead, [&] { real(this); });
}

bool Mutex::ReaderTryLock() {
  STRATA_NEXT(real, MuTryFn, "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  return Locking(this, kRead | __tsan_mutex_try_lock, [&] { return real(this); });
}

// Await and its timed forms need the mutex held in some mode; abseil tells which, TSan needs
// to be told: a reader that awaits is rare in our code, so the writer mode is assumed.
void Mutex::Await(const Condition& cond) {
  STRATA_NEXT(real, MuCondFn, "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  WaitReleasing(this, 0, [&] { real(this, cond); return true; });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  STRATA_NEXT(real, MuCondDurFn,
              "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return WaitReleasing(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  STRATA_NEXT(real, MuCondTimeFn,
              "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return WaitReleasing(this, 0, [&] { return real(this, cond, deadline); });
}

void Mutex::LockWhen(const Condition& cond) {
  STRATA_NEXT(real, MuCondFn, "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  LockWaiting(this, 0, [&] { real(this, cond); return true; });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  STRATA_NEXT(real, MuCondFn, "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  LockWaiting(this, kRead, [&] { real(this, cond); return true; });
}

// The timed LockWhen forms hold the mutex on return whatever the condition's outcome.
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  STRATA_NEXT(real, MuCondDurFn,
              "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  bool r = false;
  LockWaiting(this, 0, [&] { r = real(this, cond, timeout); return true; });
  return r;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  STRATA_NEXT(real, MuCondTimeFn,
              "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  bool r = false;
  LockWaiting(this, 0, [&] { r = real(this, cond, deadline); return true; });
  return r;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  STRATA_NEXT(real, MuCondDurFn,
              "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  bool r = false;
  LockWaiting(this, kRead, [&] { r = real(this, cond, timeout); return true; });
  return r;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  STRATA_NEXT(real, MuCondTimeFn,
              "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  bool r = false;
  LockWaiting(this, kRead, [&] { r = real(this, cond, deadline); return true; });
  return r;
}

void CondVar::Wait(Mutex* mu) {
  STRATA_NEXT(real, CvFn, "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  WaitReleasing(mu, 0, [&] { real(this, mu); return true; });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  STRATA_NEXT(real, CvDurFn,
              "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return WaitReleasing(mu, 0, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  STRATA_NEXT(real, CvTimeFn,
              "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return WaitReleasing(mu, 0, [&] { return real(this, mu, deadline); });
}

// A notification's waiters may return on its flag alone, without the mutex: publish and
// acquire on the notification itself.
void Notification::Notify() {
  STRATA_NEXT(real, NoteFn, "_ZN4absl7debian312Notification6NotifyEv");
  __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  STRATA_NEXT(real, NoteWaitFn, "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  STRATA_NEXT(real, NoteDurFn,
              "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  bool r = real(this, timeout);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  STRATA_NEXT(real, NoteTimeFn,
              "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  bool r = real(this, deadline);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

ABSL_NAMESPACE_END
}  // namespace absl
