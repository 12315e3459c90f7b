"""A Microsoft Graph mail example: a simulated Graph service (``simulator``) to develop
and test a Graph mail connector against, offline."""
