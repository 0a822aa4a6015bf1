# SPDX-License-Identifier: BSL-1.0
# A stand-in for Debian 12's default Boost 1.74 (Asio 1.18): only its version
# matters to the test that sluice refuses it at configure time.
set(Boost_FOUND TRUE)
set(Boost_VERSION 1.74.0)
