"""The bundled library's descriptor (kernels/): FlashInfer-shaped plan()/run(), performed by
the neutral plan_run core. Pure data: no torch, no kernels build."""
from harness.model.capabilities import FEATURES, Capabilities
from harness.model.routes import BUNDLED_ROUTES, OPS as ALL_OPS
from harness.model.signature import Signature
from harness.model.target_options import TargetOption
from harness.targets.descriptors._flashinfer_shape import plan_run_args

NAME = "bundled"
ROUTES = BUNDLED_ROUTES
# Its cases are the families' on ROUTES on every machine: selected without the runner.
CASES_FROM_DESCRIPTOR = True
# The cases are its own contract: a valid input it refuses fails the run (Target.owns_contract).
OWNS_CONTRACT = True
SIGNATURE = Signature(
    args=plan_run_args(),
    core="plan_run",
    # plan() copies paged_kv_indices without bounding them by the pool (kernels/ has no
    # guard for it): the relation is a known gap of the library, tracked apart from the
    # ci matrix, whose bundled rows must stay the library's contract.
    unreached=(("block_table", "the bundled plan() does not bound paged_kv_indices by the "
                               "cache's pages (no guard in kernels/ yet)"),))
# Every feature but the block-table core's metadata restage: its plan() reads the caller's
# index tensors and run() is not handed them again (the restage feature covers it).
CAPABILITIES = Capabilities(ops=frozenset(ALL_OPS), features=FEATURES - {"metadata_restage"},
                            signature=SIGNATURE)
# The library's guards (kernels/guards.py) read KERNELS_DISABLE_GUARDS at every call; the
# runner judges the names (harness/targets/bundled.py check_option).
OPTIONS = (TargetOption("disable_guards", metavar="NAMES", label="guards disabled",
                        env="KERNELS_DISABLE_GUARDS",
                        help="all|name,name: run the library without these guards (test use)"),)


def check_option(name: str, value: str) -> None:
    """--disable-guards names guards the library has (or `all`)."""
    if name != "disable_guards":
        return
    from kernels.guards import NAMES   # the names alone: no torch, no build
    names = {n.strip() for n in value.split(",") if n.strip()}
    unknown = sorted(names - set(NAMES) - {"all"})
    if unknown:
        raise ValueError(f"--disable-guards: unknown guard(s) {unknown}; known: all, "
                         f"{', '.join(sorted(NAMES))}")


def version() -> str:
    import kernels   # its names load on first use: the version alone imports no torch
    return kernels.__version__


def commit() -> str:
    # The library lives in this repository, so its commit is the repository's.
    from harness.model.platform_info import repo_commit
    return repo_commit()
