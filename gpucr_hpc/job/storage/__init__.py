"""The storage tiers: staging in node memory, its drain to the image root, retention."""
