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

def _stand_in_impl(rctx):
    # third_party/<folder> of the streamarena tree this file came from,
    # found through a file of the third_party package (a WORKSPACE macro
    # cannot turn a label into a path; a repository rule can).
    src = rctx.path(rctx.attr.anchor).dirname.get_child(rctx.attr.folder)
    if not src.exists:
        fail("streamarena: stand-in folder %s is missing" % src)
    for child in src.readdir():
        rctx.symlink(child, child.basename)

# A repository made of one of the in-tree stand-ins (third_party/README.md).
_stand_in = repository_rule(
    implementation = _stand_in_impl,
    attrs = {
        "anchor": attr.label(allow_single_file = True),
        "folder": attr.string(),
    },
    local = True,
)

def streamarena_dependencies(
        system_prefix = "/usr",
        cuda_path = "/usr/local/cuda"):
    """Declares @ck, @cmocka, @zlib, @cuda_headers and Bazel's offline stand-ins.

    Bazel 4 downloads @rules_cc, @rules_java and @remote_coverage_tools for
    any C build unless the WORKSPACE declares them; this declares streamarena's
    in-tree stand-ins under those names (unless declared already), so a
    consumer builds offline with nothing more than this call.

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
    for name in ["rules_cc", "rules_java", "remote_coverage_tools"]:
        _declare(
            _stand_in,
            name = name,
            anchor = Label("//third_party:ck.BUILD"),
            folder = name,
        )
