package objstore

// Exported for the external tests of this package, which promote through finalize.
var (
	OpenStoreEnv = openStore
	EnvOf        = envOf
)
