"""The PostgreSQL family: values, leases, queues and wake-ups in the database, over psycopg 3."""
