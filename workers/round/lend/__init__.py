"""A lent round: a phone host's round whose search and builds a helper host runs. The phone
host's half (`phone_side`: when to lend, the session, measuring what the helper built) and
the helper's (`helper_side`: searching and building for it)."""
