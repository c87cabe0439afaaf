"""Plans as data: compiled plans (pure Python), the plan table's layout, the per-row expressions
that read it, spatial predicates, the grouped matcher that runs on Spark's workers, the shape of
a batch's jobs, the clamping of private windows' values. No Spark import here."""
