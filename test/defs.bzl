"""sa_test: one cmocka unit test per module (test/<module>_test.c)."""

load("//:copts.bzl", "SA_TEST_COPTS")

# What every test links: the library, its internal headers, the shared
# host-backend fixture (fixture.h), sizes and random numbers (util.h) and
# cmocka.
SA_TEST_DEPS = [
    "//:internal",
    "//:streamarena",
    "//test:fixture",
    "//test:util",
    "@cmocka",
]

# What every test carries at run time: the TSAN suppressions (.bazelrc).
SA_TEST_DATA = ["//tools:tsan.supp"]

def sa_test(name, srcs = None, deps = [], copts = [], data = [], size = "medium", **kwargs):
    """A cc_test from <name>.c, linked with the library and cmocka.

    Args:
      name: the test, also the source file's stem (config_test -> config_test.c).
      srcs: sources; default [name + ".c"].
      deps: extra dependencies.
      copts: extra compiler flags.
      data: extra run-time files.
      size: Bazel's size; "medium" leaves sanitizer builds room, the test
        itself must not depend on wall-clock time.
      **kwargs: passed to cc_test (tags, shard_count, env, ...).
    """
    native.cc_test(
        name = name,
        srcs = srcs if srcs != None else [name + ".c"],
        copts = SA_TEST_COPTS + copts,
        deps = deps + SA_TEST_DEPS,
        data = data + SA_TEST_DATA,
        size = size,
        **kwargs
    )

def sa_tests(srcs, options = {}):
    """One sa_test per source file; options maps a test name to extra args.

    Args:
      srcs: the *_test.c files.
      options: {"arena_test": {"deps": [":fixture"], "size": "large"}, ...}.
    """
    for src in srcs:
        name = src[:-len(".c")]
        sa_test(name = name, **options.get(name, {}))
