// The exception of the native backend's core: what failed, of which kind,
// in a sentence a PyTorch user can act on. The torch layer turns the kind
// into PyTorch's own exception (torch.OutOfMemoryError for kOutOfMemory,
// RuntimeError for the others); the core needs no PyTorch header.
#ifndef SA_NATIVE_CORE_FAILURE_H
#define SA_NATIVE_CORE_FAILURE_H

#include <stdexcept>
#include <string>

namespace sa_native {

class Failure : public std::runtime_error {
 public:
  enum class Kind {
    kOutOfMemory,  // no memory for a request, after the retries
    kCapture,      // refused because a stream is being captured into a CUDA graph
    kInvalid,      // bad input: an unknown pointer, pool or device
    kUnsupported,  // something streamarena cannot do, named in the message
    kLibrary,      // the library or the driver failed a call
  };
  Failure(Kind kind, const std::string &message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

}  // namespace sa_native

#endif  // SA_NATIVE_CORE_FAILURE_H
