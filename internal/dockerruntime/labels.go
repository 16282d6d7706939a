package dockerruntime

// Every container this project creates carries these labels. The UID label is
// the ownership key; the others are an index for humans and for orphan GC.
// Containers without LabelManagedBy=ManagedByValue are never touched.
const (
	LabelPrefix     = "sandbox.code-sandbox.dev/"
	LabelManagedBy  = LabelPrefix + "managed-by"
	LabelSandboxUID = LabelPrefix + "sandbox-uid"
	LabelNamespace  = LabelPrefix + "sandbox-namespace"
	LabelName       = LabelPrefix + "sandbox-name"
	LabelNode       = LabelPrefix + "node"

	// ManagedByValue marks containers owned by the operator's managers.
	ManagedByValue = "code-sandbox-operator"
	// ManagedByMCP marks containers owned by the MCP server's Docker
	// backend. The operator's orphan collector never sees them, and the MCP
	// server never sees the operator's.
	ManagedByMCP = "code-sandbox-mcp"

	// ContainerNamePrefix prefixes the deterministic container name
	// "<prefix><sandbox UID>".
	ContainerNamePrefix = "code-sandbox-"
)

// ContainerName is the container name for a Sandbox UID. It is deterministic
// so that a retried create collides (409) and is adopted, never duplicated.
func ContainerName(uid string) string { return ContainerNamePrefix + uid }
