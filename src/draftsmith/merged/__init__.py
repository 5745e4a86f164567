"""Stage `merged`: caps and the seeded shuffle (`merge`), the data report (`data_report`),
the rule's entry (`stage`)."""
