// CopyQueue (engine.h): the slab rule of consumers whose copies complete after they are issued.
#include <utility>

#include "safetensors/engine.h"

namespace safetensors {

CopyQueue::~CopyQueue() {
  while (!pending_.empty()) {
    if (pending_.front().completion.wait) {
      try {
        pending_.front().completion.wait();
      } catch (...) {  // a failed device: nothing runs on it any more
      }
    }
    (void)prefetcher_.release(pending_.front().slab);  // lent by construction; errors are reported in retire()
    pending_.pop_front();
  }
}

void CopyQueue::add(SlabHandle slab, Completion completion, std::size_t piece) {
  pending_.push_back({slab, std::move(completion), piece});
}

Status CopyQueue::retire(bool wait, std::vector<std::size_t>* landed) {
  while (!pending_.empty()) {
    Completion& c = pending_.front().completion;
    if (c.wait && wait) {
      c.wait();
    } else if (c.done && !c.done()) {
      break;
    }
    wait = false;  // one forced wait; later copies are polled
    const Pending done = std::move(pending_.front());
    pending_.pop_front();
    SAFETENSORS_RETURN_IF_ERROR(prefetcher_.release(done.slab));
    if (done.piece != kNoPiece) landed->push_back(done.piece);
  }
  return ok_status();
}

Result<PrefetchEvent> CopyQueue::next(std::vector<std::size_t>* landed) {
  SAFETENSORS_RETURN_IF_ERROR(retire(false, landed));
  if (pending_.empty()) return prefetcher_.next();
  Result<PrefetchEvent> ev = prefetcher_.next_for(kPoll);
  if (ev.ok() && ev->kind == PrefetchEvent::Kind::kTimeout) SAFETENSORS_RETURN_IF_ERROR(retire(true, landed));
  return ev;
}

Status CopyQueue::finish(std::vector<std::size_t>* landed) {
  while (!pending_.empty()) SAFETENSORS_RETURN_IF_ERROR(retire(true, landed));
  return ok_status();
}

}  // namespace safetensors
