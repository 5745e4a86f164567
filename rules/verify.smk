# verify: re-hash the store against its manifests, shard indexes and staged records, and
# name every corrupt file and every artifact this config builds that is missing. It has
# no outputs, so it runs whenever asked, and fails on any finding. `draftsmith verify
# --fix` quarantines the corrupt ones and prints the targets that rebuild exactly them.
# Logic: src/draftsmith/store/verify.py.

from draftsmith.store import verify as store_verify


localrules:
    verify,


rule verify:
    log:
        f"{LOGS}/verify.log",
    run:
        store_verify.main(PLAN, log[0], workflow.configfiles)
