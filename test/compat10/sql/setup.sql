-- Install the extension once for the whole pg_regress run.
CREATE EXTENSION pgqueue VERSION '1.0';
SELECT extname, extversion FROM pg_extension WHERE extname = 'pgqueue';
SELECT rolname FROM pg_roles WHERE rolname LIKE 'pgqueue\_%' ORDER BY 1;
