"""Repositories streamarena needs, for its own WORKSPACE and for consumers.

    load("@streamarena//:repositories.bzl", "streamarena_dependencies")
    streamarena_dependencies()

Each repository is declared only if the WORKSPACE has not declared one of
that name already, so a consumer can point any of them elsewhere by declaring
it first. Everything is local: nothing is downloaded.
"""

def _declare(rule, name, **kwargs):
    if not native.existing_rule(name):
        rule(name = name, **kwargs)

def streamarena_dependencies(
        system_prefix = "/usr",
        cuda_path = "/usr/local/cuda"):
    """Declares @ck, @cmocka, @zlib and @cuda_headers.

    Args:
      system_prefix: where Debian's libck-dev, libcmocka-dev and zlib1g-dev
        put include/.
      cuda_path: the CUDA toolkit root; only its include/ is used (headers:
        the CUDA backend loads libcuda.so.1 at run time).
    """

    # Label() resolves against this file's repository, so the build files are
    # found both here (@) and from a consumer (@streamarena).
    _declare(
        native.new_local_repository,
        name = "ck",
        path = system_prefix,
        build_file = str(Label("//third_party:ck.BUILD")),
    )
    _declare(
        native.new_local_repository,
        name = "cmocka",
        path = system_prefix,
        build_file = str(Label("//third_party:cmocka.BUILD")),
    )
    # The benchmarks' trace reader (gzipped traces); not the library.
    _declare(
        native.new_local_repository,
        name = "zlib",
        path = system_prefix,
        build_file = str(Label("//third_party:zlib.BUILD")),
    )
    _declare(
        native.new_local_repository,
        name = "cuda_headers",
        path = cuda_path,
        build_file = str(Label("//third_party:cuda_headers.BUILD")),
    )
