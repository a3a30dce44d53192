// Package auth verifies the bearer tokens spoolcast accepts: HS256 service JWTs
// from sibling services (with a space-separated scope claim). Every verifier pins
// its algorithms: a token's own header never chooses how it is checked.
package auth
