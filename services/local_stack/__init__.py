"""`shardherd up`: the whole system on one machine (emulators, producer, coordinators, agents) and its scenarios."""
