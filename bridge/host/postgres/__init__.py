"""PostgreSQL: a session store many machines share, and a durable turn queue for many workers.

Needs psycopg 3 (`pip install 'agent-bridge[postgres]'`); nothing here is imported unless PostgreSQL is used.
"""
