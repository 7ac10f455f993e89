package bundle

// Exported for the external fuzz test, which checks decoded bundles with the scene kinds.
const (
	Magic    = magic
	FormatV1 = formatV1
)

// CheckAssetName is checkAssetName.
var CheckAssetName = checkAssetName
