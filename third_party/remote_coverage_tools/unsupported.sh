#!/bin/sh
# Stand-in for Bazel's coverage tools; see BUILD.bazel.
echo "streamarena: coverage tools are not available in the offline build" >&2
exit 1
