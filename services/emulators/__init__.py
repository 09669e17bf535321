"""Launchers for the local AWS emulators (moto server, kinesalite) on 127.0.0.1, used by tests and `shardherd up`."""
