// The client secret a call is placed with when the server requires authentication (API keys
// set; in local mode there is none and none is needed).
//
// A deployer's backend mints the secret with its API key (POST /v1/realtime/client_secrets)
// and sends the browser to this page as  /#client_secret=ek_...  A fragment never reaches any
// server, so the secret stays out of access logs; the page also takes it out of the address bar
// at once, so it does not linger in the history or travel with a copied link. One secret places
// one call (and hangs that call up); the next call needs a new one.

const PARAM = "client_secret";

/** The secret in the window's URL fragment, or null; removes it from the address bar. */
export function takeClientSecret(win) {
  const params = new URLSearchParams(win.location.hash.slice(1));
  const secret = params.get(PARAM);
  if (secret === null) return null;
  params.delete(PARAM);
  const rest = params.toString();
  const url = win.location.pathname + win.location.search + (rest ? `#${rest}` : "");
  win.history.replaceState(win.history.state, "", url);
  return secret.trim() || null;
}
