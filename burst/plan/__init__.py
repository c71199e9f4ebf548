"""Where and how a run continues: the card catalog, the memory model, the pure planner, regions."""
