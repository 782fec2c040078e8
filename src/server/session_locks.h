// One request at a time per session (sessions.h): SessionLocks hands a session's name to one
// request (or DELETE) at a time.
//
// A request that finds its session held asks the holder whether it is letting go without a live
// client to answer (Holder::leaving): its client has gone away (a chat UI's stop closes the stream
// and sends the next message at once), or its turn is already ending. Such a holder lets go within
// a scheduler step or so (its job cancelled, its turn's recording committed), so the request waits
// for it, bounded, on its own HTTP thread (never the scheduler's), and then continues what that
// turn committed, exactly as if it had come after it. A live holder is answered 409 at once.
#pragma once
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace anvil::server {

class SessionLocks {
 public:
  // What a request holding a session tells the others.
  class Holder {
   public:
    virtual ~Holder() = default;
    // True when this holder is on its way out without a client to answer: its client has gone away
    // (it then makes sure it lets go soon: cancels its job), or its turn is ending. Called under the
    // locks' mutex: quick, and never calls back into SessionLocks.
    virtual bool leaving() = 0;
  };

  enum class Acquire {
    kAcquired,
    kBusy,      // a live request holds it
    kTimedOut,  // its holder was leaving but did not let go within the patience
  };
  // How long acquire() waits by default for a leaving holder.
  static constexpr std::chrono::milliseconds kPatience{2000};

  // Hands `name` to `holder` (nullptr: a holder that never reports leaving, as a DELETE is, which
  // is over in a moment). When it is held by a leaving holder, waits up to `patience` for it to let
  // go, re-asking at each release of any name.
  Acquire acquire(const std::string& name, std::shared_ptr<Holder> holder,
                  std::chrono::milliseconds patience = kPatience);
  void release(const std::string& name);
  bool busy(const std::string& name);

 private:
  std::mutex mu_;
  std::condition_variable released_;
  std::map<std::string, std::shared_ptr<Holder>> held_;  // a null holder counts as live
};

}  // namespace anvil::server
