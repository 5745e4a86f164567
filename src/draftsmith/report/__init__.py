"""Stage `report`: figures (`plots`), the run summary (`summary`), Snakemake report markers
and the end-of-run HTML report (`workflow`), the stage's settings (`settings`), the rule's
entry (`stage`)."""
