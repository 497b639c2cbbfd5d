// Kernel self-check: runs each kernel's forward and backward on small random inputs and compares the
// gradients with float64 central finite differences. Prints one line per kernel; returns true if all pass.
#pragma once
#include <ostream>

namespace olmosft {
bool kernel_selfcheck(std::ostream& out);
}
