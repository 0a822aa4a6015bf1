// SPDX-License-Identifier: BSL-1.0
// Read by Doxygen only (docs/Doxyfile), never compiled. queue_error.hpp specializes
// boost::system::is_error_code_enum; Doxygen does not read Boost, cannot find
// the enclosing scope and warns "Internal inconsistency: scope ... not found".
// Declaring the scope here silences that quirk; EXCLUDE_SYMBOLS keeps `boost`
// out of the generated pages.
namespace boost {
namespace system {
template <class T>
struct is_error_code_enum;
}  // namespace system
}  // namespace boost
