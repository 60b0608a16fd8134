-- trailbound's PostgreSQL in docker-compose: the metadata store and the target.
CREATE DATABASE trailbound_meta;
CREATE DATABASE trailbound_target;
