"""What a run did and whether a profile works: goodput accounting, the report picture, doctor."""
