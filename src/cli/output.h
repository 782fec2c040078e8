// Standard output as the CLI's product. A write to it can fail: the reader of a pipe went away
// (`anvil generate ... | head -c 10`) or the disk is full (`> /dev/full`). SIGPIPE is ignored, so
// such a write fails with an error instead of killing the process mid-answer (which lost a
// --session's last state and left the KV store's writer unflushed); streaming commands stop
// generating at the next token (output_ok() is false), save what they have, and main() turns the
// failure into the exit code: 141 (128 + SIGPIPE, what a shell reports for a tool SIGPIPE killed)
// without a message for a closed pipe, else "anvil: error: cannot write the output: ..." and 1.
#pragma once

namespace anvil::cli {

// Once, at startup: SIGPIPE ignored (a closed pipe is then an EPIPE write error).
void watch_output();

// Flushes stdout; false once any write to it has failed (the first failure's cause is kept).
bool output_ok();

// At exit: flushes stdout and returns `code` when every write succeeded. Otherwise a closed pipe
// gives 141 (quietly) and any other failure a message on stderr and 1, unless `code` already
// reports another error (neither 0 nor 130, the interrupted run's), which is kept.
int finish_output(int code);

}  // namespace anvil::cli
