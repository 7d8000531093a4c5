// manifestcheck validates Kubernetes objects as the API server of this module's release would
// at create time: each object is decoded strictly (an unknown or duplicated field is an error),
// defaulted, converted to the internal version, and passed to the API server's own validation
// for its kind. A kind it has no validation for is an error, so nothing passes unchecked.
//
// Input: a JSON array of objects on stdin (tests/unit/test_deploy_kubernetes.py renders the
// kustomizations and pipes them in). Output: one line per problem, "KIND/NAME: problem".
// Exit 0 when every object is valid, 1 when one is not, 2 when the input cannot be read.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	jsonserializer "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	podutil "k8s.io/kubernetes/pkg/api/pod"
	"k8s.io/kubernetes/pkg/apis/apps"
	_ "k8s.io/kubernetes/pkg/apis/apps/install"
	appsvalidation "k8s.io/kubernetes/pkg/apis/apps/validation"
	"k8s.io/kubernetes/pkg/apis/core"
	_ "k8s.io/kubernetes/pkg/apis/core/install"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	"k8s.io/kubernetes/pkg/apis/rbac"
	_ "k8s.io/kubernetes/pkg/apis/rbac/install"
	rbacvalidation "k8s.io/kubernetes/pkg/apis/rbac/validation"
)

// validate runs the API server's create-time validation of one internal object.
func validate(obj runtime.Object) (field.ErrorList, error) {
	switch o := obj.(type) {
	case *core.Namespace:
		return corevalidation.ValidateNamespace(o), nil
	case *core.ServiceAccount:
		return corevalidation.ValidateServiceAccount(o), nil
	case *core.Secret:
		return corevalidation.ValidateSecret(o), nil
	case *core.ConfigMap:
		return corevalidation.ValidateConfigMap(o), nil
	case *core.Service:
		// The service storage fills ClusterIPs from ClusterIP before it validates a create
		// (pkg/registry/core/service/storage: normalizeClusterIPs). A Service whose IPs the
		// allocator would choose is not one our manifests make: say so rather than guess.
		if o.Spec.ClusterIP == "" && o.Spec.Type != core.ServiceTypeExternalName {
			return nil, fmt.Errorf("spec.clusterIP is empty: the API server would allocate one; manifestcheck validates headless Services (clusterIP: None) only")
		}
		if len(o.Spec.ClusterIPs) == 0 && o.Spec.ClusterIP != "" {
			o.Spec.ClusterIPs = []string{o.Spec.ClusterIP}
		}
		return corevalidation.ValidateServiceCreate(o), nil
	case *apps.DaemonSet:
		opts := podutil.GetValidationOptionsFromPodTemplate(&o.Spec.Template, nil)
		return appsvalidation.ValidateDaemonSet(o, opts), nil
	case *rbac.ClusterRole:
		return rbacvalidation.ValidateClusterRole(o, rbacvalidation.ClusterRoleValidationOptions{}), nil
	case *rbac.ClusterRoleBinding:
		return rbacvalidation.ValidateClusterRoleBinding(o), nil
	}
	return nil, fmt.Errorf("no validation known here for %T: add its API server validation to manifestcheck", obj)
}

// check decodes one object strictly and validates it; it returns the problems found.
func check(raw json.RawMessage) (string, []string) {
	scheme := legacyscheme.Scheme
	strict := jsonserializer.NewSerializerWithOptions(jsonserializer.DefaultMetaFactory, scheme, scheme,
		jsonserializer.SerializerOptions{Strict: true})
	var meta struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	_ = json.Unmarshal(raw, &meta)
	name := meta.Kind + "/" + meta.Metadata.Name
	obj, gvk, err := strict.Decode(raw, nil, nil)
	if err != nil {
		return name, []string{"decode: " + err.Error()}
	}
	scheme.Default(obj)
	internal, err := scheme.ConvertToVersion(obj, schema.GroupVersion{Group: gvk.Group, Version: runtime.APIVersionInternal})
	if err != nil {
		return name, []string{"convert: " + err.Error()}
	}
	errs, err := validate(internal)
	if err != nil {
		return name, []string{err.Error()}
	}
	var problems []string
	for _, e := range errs {
		problems = append(problems, e.Error())
	}
	return name, problems
}

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "manifestcheck: reading stdin: %v\n", err)
		os.Exit(2)
	}
	var objects []json.RawMessage
	if err := json.Unmarshal(data, &objects); err != nil {
		fmt.Fprintf(os.Stderr, "manifestcheck: stdin is not a JSON array of objects: %v\n", err)
		os.Exit(2)
	}
	if len(objects) == 0 {
		fmt.Fprintln(os.Stderr, "manifestcheck: no objects on stdin")
		os.Exit(2)
	}
	bad := 0
	for _, raw := range objects {
		name, problems := check(raw)
		for _, p := range problems {
			fmt.Printf("%s: %s\n", name, p)
		}
		if len(problems) > 0 {
			bad++
		}
	}
	if bad > 0 {
		os.Exit(1)
	}
}
