-- Which secret verified a delivery, as a fingerprint (16 hex digits of a
-- labelled SHA-256 of it, never the secret): `secret_index` is a position in
-- whatever list was configured then, so after a rotation reorders the list it
-- credits the wrong secret. Rows stored before this have none (NULL).
ALTER TABLE webhook_inbox ADD COLUMN secret_fingerprint TEXT;
