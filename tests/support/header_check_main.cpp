// SPDX-License-Identifier: BSL-1.0
// Links the generated one-header-per-TU checks; compiling them is the test.
int main() {
  return 0;
}
